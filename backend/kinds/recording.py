"""The `recording` kind: a user's own training loop recorded by the SDK (detlab.Recorder), streamed or uploaded
(detlab.backend.services.recordings); its one run is fed by the SDK, never sent to a worker."""

from __future__ import annotations

from typing import Any

from detlab.backend.kinds.base import InvalidJob, Kind
from detlab.backend.models import RECORDING, Job
from detlab.core.wire import RunKind


class Recording(Kind):
    name = RECORDING
    description = "a user's own training loop, recorded by detlab.Recorder"
    report_name = "train"
    dispatched = False

    def run_kind(self, job: Job) -> RunKind:
        return "train"

    def bisect_refusal(self, job: Job) -> str | None:
        return (f"job {job.id} is an SDK recording: detlab cannot run your training again. Bisect a train job of a "
                "built-in workload, or record more detail with detlab.Recorder (grads=True, optimizer=...)")

    def spec(self, job: Job) -> dict[str, Any]:
        # The SDK sent it from a user's own loop: the server holds nothing that could run it again.
        raise InvalidJob(f"job {job.id} is a recording of a user's own training loop (detlab.Recorder): the server "
                         "cannot run it again; run the script again to record anew")


KIND = Recording()
