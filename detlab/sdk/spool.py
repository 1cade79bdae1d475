"""A rank's record file, written by a background thread: the training loop hands over a job and goes on.

A job is a function that returns the record to append (a step's job first waits for its digests). Jobs
run in the order given, each line is flushed as written, so a crash keeps every record finished before
it. At most `depth` jobs wait: a loop that outruns the writer waits for it rather than piling up memory.
An error in a job is raised in the training loop at its next call, and stops the writer.
"""

from __future__ import annotations

import os
import queue
import threading
from collections.abc import Callable
from pathlib import Path

from detlab.core.wire import CallsRecord, EnvRecord, StepRecord, TensorsRecord

Record = EnvRecord | TensorsRecord | StepRecord | CallsRecord
Job = Callable[[], Record]
_STOP = object()
DEPTH = 4  # jobs that may wait for the writer


class Spool:
    def __init__(self, path: Path, *, depth: int = DEPTH, overwrite: bool = False, append: bool = False) -> None:
        # O_EXCL refuses a file already there: two recordings never mix in one file. 0600: the records are the
        # user's (tensor names, losses), not everyone's on a shared node. append: a resumed recording's own file.
        flags = (os.O_WRONLY | os.O_APPEND if append
                 else os.O_WRONLY | os.O_CREAT | (os.O_TRUNC if overwrite else os.O_EXCL))
        self._file = os.fdopen(os.open(path, flags, 0o600), "w", encoding="utf-8")
        self._path = path
        self._jobs: queue.Queue[object] = queue.Queue(maxsize=depth)
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name=f"detlab-spool-{path.name}", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while (job := self._jobs.get()) is not _STOP:
            try:
                if self._error is None:
                    record = job()  # type: ignore[operator]
                    self._file.write(record.model_dump_json() + "\n")
                    self._file.flush()
            except BaseException as exc:  # handed to the training loop, which decides
                self._error = exc
        self._file.close()

    def check(self) -> None:
        """Raise what went wrong in the writer, if anything did."""
        if self._error is not None:
            raise RuntimeError(f"detlab: writing {self._path} failed: {self._error}") from self._error

    def put(self, job: Job) -> None:
        self.check()
        while True:
            try:
                self._jobs.put(job, timeout=1.0)
                return
            except queue.Full:
                if not self._thread.is_alive():
                    raise RuntimeError(f"detlab: the writer of {self._path} stopped") from self._error

    def close(self) -> None:
        """Write every job handed over, then close the file; raise the writer's error, if any."""
        if self._thread.is_alive():
            self._jobs.put(_STOP)
            self._thread.join()
        self.check()
