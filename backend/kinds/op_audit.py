"""The `op-audit` kind: the ops of a workload's training step re-run under each config: which are
nondeterministic on this stack. The workload is a built-in one, or a registered script that hands its step
to `detlab.audit`."""

from __future__ import annotations

from typing import Any, Literal

from detlab.backend.kinds.base import InvalidJob, Plan
from detlab.backend.kinds.diagnosis import DiagnosisCreate, DiagnosisKind, check
from detlab.backend.models import Job
from detlab.backend.reports import diagnosis as diagnosis_report
from detlab.core import configs, diagnosis
from detlab.core.settings import Settings
from detlab.core.wire import SCRIPT_RUN_KINDS, DiagnosisSpec
from detlab.core.workloads import WorkloadInfo


class OpAuditCreate(DiagnosisCreate):
    """The workload whose step is audited, and re-runs per kept call."""

    model_config = {"json_schema_extra": {"examples": [
        {"kind": "op-audit", "workload": "scatter", "configs": [{"preset": "default", "threads": 2}]}]}}

    kind: Literal["op-audit"]


class OpAudit(DiagnosisKind):
    name = "op-audit"
    description = "a workload's ops re-run: which are nondeterministic on this stack"
    request = OpAuditCreate
    config = staticmethod(diagnosis_report.audit_config)

    def plan(self, data: OpAuditCreate, *, bodies: list[configs.ConfigBody], settings: Settings,
             workloads: dict[str, WorkloadInfo]) -> Plan:
        spec = data.diagnosis or DiagnosisSpec()
        if spec.workload is not None and data.workload not in (None, spec.workload):
            raise InvalidJob("give the workload once: `workload` (diagnosis.workload is batch-invariance's)")
        workload = data.workload or spec.workload
        if workload is None:
            raise InvalidJob("an op-audit needs a workload: the one whose training step is audited")
        # a registered script hands its step to detlab.audit, which records under the worker (docs/sdk.md)
        check(data, bodies, workloads, workload, scripts=self.name in SCRIPT_RUN_KINDS)
        params = self.params(spec, None)
        if workloads[workload].script:
            params["script"] = True
        return Plan(workload=workload, steps=1, bodies=bodies, params=params, unit="cells")

    def spec(self, job: Job) -> dict[str, Any]:
        return {"diagnosis": job.params["diagnosis"], "workload": job.workload}

    def list_verdict(self, job: Job, result: dict[str, Any]) -> str | None:
        return diagnosis.audit_verdict(result["configs"])


KIND = OpAudit()
