"""What the framework callbacks share: detlab.Recorder's options, and a Recorder made when training starts.

A trainer makes its optimizer after the callback is made, and a Recorder takes the optimizer whose state
it records when it is made: so a callback holds the options and makes its Recorder at train start. Steps
are numbered as the frameworks count them: step N is the state after the N-th optimizer step (what a
checkpoint of global step N holds), and `every=N` records steps N, 2N, ...
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from detlab.tensors.named import NameFilter

if TYPE_CHECKING:
    import torch

    from detlab.sdk.recorder import Recorder


class RecorderCallback:
    """A callback's detlab.Recorder: a mixin that goes before the framework's Callback class in the bases.

    Options are detlab.Recorder's (`server=` and `token=` too: online mode), except `optimizer_state=True` for
    its `optimizer=`: the trainer's optimizer, which exists only once training starts.
    """

    def __init__(self, out: str | os.PathLike[str] | None = None, *, server: str | None = None,
                 token: str | None = None, name: str | None = None, tags: Sequence[str] = (), every: int = 1,
                 names: NameFilter = None, grads: bool = False, optimizer_state: bool = False,
                 buffers: bool = False, overwrite: bool = False, rng: bool = True, batches: bool = True) -> None:
        super().__init__()
        if isinstance(tags, str):
            raise TypeError("tags takes a list of strings, e.g. tags=['ci']")
        if out is None and server is None:
            raise TypeError("DetlabCallback needs out=DIR, the directory to write the records to (or server=URL)")
        self.out = Path(out) if out is not None else None
        self._options: dict[str, Any] = {"server": server, "token": token, "name": name, "tags": list(tags),
                                         "every": every, "names": names,
                                         "grads": grads, "buffers": buffers, "overwrite": overwrite, "rng": rng}
        self._grads, self._optimizer_state, self._batches = grads, optimizer_state, batches
        self.recorder: Recorder | None = None

    def _start(self, optimizer: torch.optim.Optimizer | None, *, resumed_at: int = 0) -> None:
        """Make the Recorder. `resumed_at` > 0: the framework restored a checkpoint of that global step (Lightning's
        ckpt_path=, the HF Trainer's resume_from_checkpoint=): continue the recording in `out` (resume=True)."""
        from detlab.sdk.recorder import Recorder

        self._end(failed=True)  # left open by a training that raised where the framework has no event for it
        self.recorder = Recorder(self.out, optimizer=optimizer if self._optimizer_state else None,
                                 **{**self._options, "resume": resumed_at > 0, "overwrite":
                                    self._options["overwrite"] and resumed_at == 0})

    def _record_restored(self, step: int, model: torch.nn.Module) -> None:
        """The restored state of the checkpoint's step, recorded again beside the step's first record."""
        if self.recorder is not None:
            self.recorder.step(step, model)

    def _record_grads(self, step: int, model: torch.nn.Module) -> None:
        if self.recorder is not None and self._grads:
            self.recorder.grads(step, model)

    def _record_step(self, step: int, model: torch.nn.Module, loss: Any, batch: Any = None) -> None:
        if self.recorder is not None:
            self.recorder.step(step, model, loss=loss, batch=batch if self._batches and batch else None)

    def _end(self, *, failed: bool = False) -> None:
        """Close the recorder (queued records are written): run.json says `finished`, or `failed`."""
        recorder, self.recorder = self.recorder, None
        if recorder is None:
            return
        if failed:
            recorder.__exit__(RuntimeError, None, None)  # the Recorder's way to be closed as failed
        else:
            recorder.close()
