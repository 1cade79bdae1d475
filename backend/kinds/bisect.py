"""The `bisect` kind: a diverged train pair replayed up to its first divergent step, that step probed module by
module. Made from a train job (POST /jobs/{id}/bisect, detlab.backend.services.bisect), never submitted alone."""

from __future__ import annotations

from typing import Any

from detlab.backend.kinds.base import InvalidJob, Kind
from detlab.backend.models import BISECT, Job
from detlab.core.wire import RunKind


class Bisect(Kind):
    name = BISECT
    description = "a diverged train pair's first divergent step replayed module by module"
    report_name = "bisect"
    records_findings = False  # a replay of one step measures no config

    def spec(self, job: Job) -> dict[str, Any]:
        raise InvalidJob(f"job {job.id} is a bisect: POST /jobs/{job.id}/rerun replays it again")

    def run_kind(self, job: Job) -> RunKind:
        return "train"

    def probe_step(self, job: Job) -> int | None:
        found = job.params.get("bisect")
        return int(found["step"]) if found else None


KIND = Bisect()
