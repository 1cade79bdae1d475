"""What every job kind provides (Kind), the request fields all kinds share, and the plan a kind makes of a request."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from pydantic import Field

from detlab.backend.reports import bisect as bisect_report
from detlab.backend.reports import collective as collective_report
from detlab.backend.reports import diagnosis as diagnosis_report
from detlab.backend.reports import fix as fix_report
from detlab.backend.reports import resume as resume_report
from detlab.backend.reports import train as train_report
from detlab.backend.schemas import RequestBody
from detlab.core import configs
from detlab.core.results import (
    BisectResult,
    CollectiveResult,
    DiagnosisResult,
    FixResult,
    JobResult,
    ResumeResult,
    TrainResult,
)
from detlab.core.wire import INT32, RunKind, Tags

if TYPE_CHECKING:
    from sqlalchemy.orm import Session

    from detlab.backend.models import Job, Run
    from detlab.core.settings import Settings
    from detlab.core.workloads import WorkloadInfo

# Which report builds a kind's result (detlab.backend.reports.<name>), and so which GET /jobs/{id}/<path> serves it.
ReportName = Literal["train", "collective", "bisect", "diagnosis", "fix", "resume"]
REPORTS = {"train": train_report, "collective": collective_report, "bisect": bisect_report,
           "diagnosis": diagnosis_report, "fix": fix_report, "resume": resume_report}
# The typed result each report builds (detlab.core.results): a result is checked against it when built.
RESULT_MODELS: dict[ReportName, type[JobResult]] = {"train": TrainResult, "collective": CollectiveResult,
                                                    "bisect": BisectResult, "diagnosis": DiagnosisResult,
                                                    "fix": FixResult, "resume": ResumeResult}
RESULT_PATHS: dict[ReportName, str] = {"train": "comparison", "collective": "collective", "bisect": "bisect",
                                       "diagnosis": "diagnosis", "fix": "fix", "resume": "resume"}


class InvalidJob(ValueError):
    """A job request that cannot run; the message says what to change."""


class JobRequest(RequestBody):
    """The fields every submitted kind takes. Integers are bounded to the Integer columns they fill; the server's
    own limits are checked after. A kind's model adds its own fields: a key no kind of its takes is refused."""

    kind: str
    configs: list[dict[str, Any]] = Field(min_length=1, max_length=8)
    world_size: int = Field(default=1, ge=1, le=INT32)
    repeats: int = Field(default=1, ge=1, le=INT32)
    fingerprint_interval: int = Field(default=1, ge=1, le=INT32)
    queue: str = Field(default="default", pattern=r"^[A-Za-z0-9._-]{1,64}$")
    tags: Tags = Field(default_factory=list)


@dataclass
class Plan:
    """What a request becomes: the job's workload, the size of each run (steps, or cells for the kinds that
    measure cells), one config body per config index, and the kind's own params stored with the job."""

    workload: str
    steps: int
    bodies: list[configs.ConfigBody]
    params: dict[str, Any] = field(default_factory=dict)
    unit: Literal["steps", "cells"] = "steps"


def typed(report: ReportName, result: dict[str, Any] | None) -> dict[str, Any] | None:
    """A report's result through its typed model (detlab.core.results), as JSON: the keys it set, checked."""
    return None if result is None else RESULT_MODELS[report].model_validate(result).model_dump(
        mode="json", exclude_unset=True)


class Kind:
    """One job kind: its request model (None: not submitted through POST /jobs), its plan, its report, its
    list verdict and the request that submits one of its jobs again."""

    name: ClassVar[str]
    description: ClassVar[str]
    request: ClassVar[type[JobRequest] | None] = None
    report_name: ClassVar[ReportName | None] = None  # None: it depends on the job (report() says)
    dispatched: ClassVar[bool] = True  # its runs are sent to workers (False: the SDK feeds them)
    records_findings: ClassVar[bool] = True  # its result's measurements go to the team history

    def plan(self, data: Any, *, bodies: list[configs.ConfigBody], settings: Settings,
             workloads: dict[str, WorkloadInfo]) -> Plan:
        raise InvalidJob(f"a {self.name} job is not submitted through POST /jobs")

    def report(self, job: Job) -> ReportName:
        """Which report builds this job's result."""
        if self.report_name is None:
            raise NotImplementedError
        return self.report_name

    def build(self, *, session: Session, job: Job) -> dict[str, Any] | None:
        """The job's result from its records as they are now, as its typed model writes it; None before anything
        is recorded."""
        return typed(self.report(job), REPORTS[self.report(job)].build(session=session, job=job))

    def run_kind(self, job: Job) -> RunKind:
        """What each of the job's runs executes (the claim reply's `kind`)."""
        raise NotImplementedError

    def run_fields(self, run: Run) -> dict[str, Any]:
        """The kind's own keys of one run's claim reply (wire.RunSpec), beside those every run has."""
        return {}

    def bisect_refusal(self, job: Job) -> str | None:
        """Why a pair of this job cannot be bisected, whatever its state (None: it can, once finished). Bisect
        replays a train pair (detlab.backend.services.bisect)."""
        return f"job {job.id} is a {job.kind} job; bisect replays the pair of a train job"

    def probe_step(self, job: Job) -> int | None:
        """The step each of the job's runs probes module by module (the claim reply's `probe_step`), or None."""
        return None

    def spec(self, job: Job) -> dict[str, Any]:
        """The kind's own keys of the request that submits this job again (the shared ones are added)."""
        raise InvalidJob(f"a {self.name} job is not submitted through POST /jobs")

    def advance(self, *, session: Session, job: Job) -> bool:
        """Called by settle when every run of the job has finished: add the next round's runs and return True to
        keep the job running (a search in rounds: `fix`), or False to let it finish. Most kinds run one round."""
        return False

    def list_verdict(self, job: Job, result: dict[str, Any]) -> str | None:
        """The result in one word for the jobs list; None when nothing was compared."""
        return REPORTS[self.report(job)].verdict(result)  # type: ignore[no-any-return]
