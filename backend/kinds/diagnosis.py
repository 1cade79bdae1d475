"""What the two diagnosis kinds (batch_invariance, op_audit) share: one rank per config, a workload of the workers'
that is not a script, `diagnosis` parameters, and a result per config (detlab.backend.reports.diagnosis)."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from detlab.backend.kinds.base import InvalidJob, JobRequest, Kind, typed
from detlab.backend.models import Job
from detlab.backend.reports import diagnosis as diagnosis_report
from detlab.core import configs
from detlab.core.wire import DiagnosisSpec, RunKind
from detlab.core.workloads import WorkloadInfo


class DiagnosisCreate(JobRequest):
    """The keys of a diagnosis job: the workload and the `diagnosis` parameters, bounded so a worker can hold them."""

    workload: str | None = Field(default=None, min_length=1, max_length=64)
    diagnosis: DiagnosisSpec | None = None


def check(data: DiagnosisCreate, bodies: list[configs.ConfigBody], workloads: dict[str, WorkloadInfo],
          workload: str | None, *, scripts: bool = False) -> None:
    """One rank per config, and a workload (if any) the workers can build a model of, or with `scripts` (the
    kind's runs are in SCRIPT_RUN_KINDS) a registered script."""
    if data.world_size != 1 or any((b.world_size or 1) != 1 for b in bodies):
        raise InvalidJob(f"a {data.kind} job runs one rank per config: world_size must be 1")
    if workload is not None and (workload not in workloads or (workloads[workload].script and not scripts)):
        known = sorted(name for name, info in workloads.items() if scripts or not info.script)
        raise InvalidJob(f"unknown workload {workload!r} for {data.kind}; known: {known}")


class DiagnosisKind(Kind):
    """A kind whose runs are one rank that measures (detlab.worker.ranks.diagnose) and whose result is per config."""

    report_name = "diagnosis"
    config: diagnosis_report.Config  # how a config's records read

    def run_kind(self, job: Job) -> RunKind:
        return self.name  # type: ignore[return-value]

    def build(self, *, session: Any, job: Job) -> dict[str, Any] | None:
        return typed("diagnosis", diagnosis_report.build(session=session, job=job, config=type(self).config))

    def about_workload(self, job: Job, result: dict[str, Any], workload: str) -> bool:
        """Whether this finished job (its `result`) measured `workload`'s model (a why-report cites it then)."""
        return (result.get("workload") or job.workload) == workload

    @staticmethod
    def params(spec: DiagnosisSpec, workload: str | None) -> dict[str, Any]:
        return {"diagnosis": spec.model_copy(update={"workload": workload}).model_dump()}
