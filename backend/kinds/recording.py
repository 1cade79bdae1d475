"""The `recording` kind: a user's own training loop recorded by the SDK (detlab.Recorder), streamed or uploaded
(detlab.backend.services.recordings); its one run is fed by the SDK, never sent to a worker."""

from __future__ import annotations

from detlab.backend.kinds.base import Kind
from detlab.backend.models import RECORDING, Job
from detlab.core.wire import RunKind


class Recording(Kind):
    name = RECORDING
    description = "a user's own training loop, recorded by detlab.Recorder"
    report_name = "train"
    dispatched = False

    def run_kind(self, job: Job) -> RunKind:
        return "train"


KIND = Recording()
