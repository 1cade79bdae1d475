"""`DetlabCallback` for Lightning: records a LightningModule's training with detlab.Recorder (docs/sdk.md).

Importing this module imports Lightning: `lightning.pytorch`, or `pytorch_lightning` where only that is
installed. Lightning calls a callback's hooks by name, so one class serves the Trainers of both packages.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

try:
    from lightning.pytorch import Callback, LightningModule, Trainer
except ModuleNotFoundError:  # the package's name before Lightning 2.0, still published
    from pytorch_lightning import Callback, LightningModule, Trainer  # type: ignore[assignment]

from detlab.integrations.recording import RecorderCallback

__all__ = ["DetlabCallback"]


class DetlabCallback(RecorderCallback, Callback):
    """Records the LightningModule's tensors after every optimizer step, on every rank, into `out`.

    >>> trainer = lightning.Trainer(max_steps=100, callbacks=[DetlabCallback(out="runs/a")])

    Options are detlab.Recorder's (name, tags, every, names, grads, buffers, overwrite, rng: on by default), with
    `optimizer_state=True` for the state of the module's one optimizer; `batches=True` (default) records each
    step's batches (a step's list of them with accumulate_grad_batches).

    `trainer.fit(..., ckpt_path=...)` restores global step K: the callback continues the recording in `out`
    (resume=True) and records the restored state of step K first, so that `detlab compare` says whether the
    restore matched and what the resumed run lost.

    Step N is the state after the N-th optimizer step (`trainer.global_step`), recorded at the end of the
    batch that made it: with `accumulate_grad_batches`, the last batch of the step. The loss is the sum of
    what training_step returned as loss over the step's batches, each of which Lightning divides by
    accumulate_grad_batches. `grads=True` records the gradients in on_before_optimizer_step: accumulated,
    reduced across ranks, and before `gradient_clip_val` clips them. The recording is closed at the end of
    fit, and marked failed when training raises (on_exception).
    """

    _loss: torch.Tensor | None = None
    _stepped = 0
    _seen: list[Any]

    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        optimizers = trainer.optimizers
        if self._optimizer_state and len(optimizers) != 1:
            raise ValueError(f"DetlabCallback(optimizer_state=True) records one optimizer's state; this module "
                             f"configures {len(optimizers)}: pass optimizer_state=False")
        self._start(optimizers[0] if self._optimizer_state else None, resumed_at=trainer.global_step)
        self._loss, self._stepped, self._seen = None, trainer.global_step, []
        if trainer.global_step > 0:
            self._record_restored(trainer.global_step, pl_module)

    def on_before_optimizer_step(self, trainer: Trainer, pl_module: LightningModule,
                                 optimizer: torch.optim.Optimizer) -> None:
        self._record_grads(trainer.global_step + 1, pl_module)  # the step this optimizer.step() makes

    def on_train_batch_end(self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        loss = outputs.get("loss") if isinstance(outputs, Mapping) else outputs
        if isinstance(loss, torch.Tensor):
            self._loss = loss.detach() if self._loss is None else self._loss + loss.detach()
        self._seen.append(batch)
        if trainer.global_step == self._stepped:
            return  # a batch that only accumulated gradients
        self._stepped = trainer.global_step
        loss, self._loss = self._loss, None
        seen, self._seen = self._seen, []
        self._record_step(trainer.global_step, pl_module, loss, seen[0] if len(seen) == 1 else seen)

    def on_train_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._end()

    def on_exception(self, trainer: Trainer, pl_module: LightningModule, exception: BaseException) -> None:
        self._end(failed=True)
