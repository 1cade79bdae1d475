"""The `batch-invariance` kind: the same samples through ops (and a workload's forward) at several batch sizes."""

from __future__ import annotations

from typing import Any, Literal

from detlab.backend.kinds.base import Plan
from detlab.backend.kinds.diagnosis import DiagnosisCreate, DiagnosisKind, check
from detlab.backend.models import Job
from detlab.backend.reports import diagnosis as diagnosis_report
from detlab.core import configs, diagnosis
from detlab.core.settings import Settings
from detlab.core.wire import SCRIPT_RUN_KINDS, DiagnosisSpec
from detlab.core.workloads import WorkloadInfo


class BatchInvarianceCreate(DiagnosisCreate):
    """ops × dtypes × batch sizes at `features` (and diagnosis.workload's forward, if given)."""

    model_config = {"json_schema_extra": {"examples": [
        {"kind": "batch-invariance", "configs": [{"preset": "default"}],
         "diagnosis": {"ops": ["mm", "sum"], "dtypes": ["float32"], "batch_sizes": [1, 2, 4, 8], "features": 256}}]}}

    kind: Literal["batch-invariance"]


class BatchInvariance(DiagnosisKind):
    name = "batch-invariance"
    description = "the same samples at several batch sizes: where invariance breaks"
    request = BatchInvarianceCreate
    config = staticmethod(diagnosis_report.invariance_config)

    def plan(self, data: BatchInvarianceCreate, *, bodies: list[configs.ConfigBody], settings: Settings,
             workloads: dict[str, WorkloadInfo]) -> Plan:
        spec = data.diagnosis or DiagnosisSpec()
        workload = data.workload or spec.workload
        # a registered script hands its model to detlab.batch_invariance, which records under the worker
        check(data, bodies, workloads, workload, scripts=self.name in SCRIPT_RUN_KINDS)
        steps = spec.cells() + (len(spec.batch_sizes) if workload else 0)
        params = self.params(spec, workload)
        if workload is not None and workloads[workload].script:
            params["script"] = True
        # the job's workload names the model checked, else the kind (an ops-only job)
        return Plan(workload=workload or self.name, steps=steps, bodies=bodies, params=params, unit="cells")

    def spec(self, job: Job) -> dict[str, Any]:
        return {"diagnosis": job.params["diagnosis"]}

    def list_verdict(self, job: Job, result: dict[str, Any]) -> str | None:
        return diagnosis.invariance_verdict(result["configs"])

    def about_workload(self, job: Job, result: dict[str, Any], workload: str) -> bool:
        # An ops-only job has no model: its configs' `model` is null.
        return any(isinstance(c, dict) and isinstance(c.get("model"), dict) and c["model"].get("workload") == workload
                   for c in result.get("configs") or [])


KIND = BatchInvariance()
