"""`DetlabCallback` for the Hugging Face Trainer: records its training with detlab.Recorder (docs/sdk.md).

Importing this module imports transformers.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments

from detlab.integrations.recording import RecorderCallback

__all__ = ["DetlabCallback"]


class DetlabCallback(RecorderCallback, TrainerCallback):
    """Records the model's tensors after every optimizer step, on every rank, into `out`.

    >>> trainer = transformers.Trainer(model, args, train_dataset=data, callbacks=[DetlabCallback(out="runs/a")])

    Options are detlab.Recorder's (name, tags, every, names, grads, buffers, overwrite), with
    `optimizer_state=True` for the state of the Trainer's optimizer.

    Step N is the state after the N-th optimizer step (`state.global_step`, as checkpoint-N holds it),
    recorded in on_step_end. The Trainer gives callbacks no loss: the one recorded is the `loss` the model's
    forward returned in training (none where a custom compute_loss leaves `outputs.loss` out). With gradient
    accumulation the step's forward passes are combined as the model scaled them: summed where the Trainer
    passed `num_items_in_batch` (the model then divides by the step's token count, so each is a share), else
    averaged. `grads=True` records, in on_pre_optimizer_step,
    the gradients the optimizer step consumes: accumulated, reduced across ranks, clipped. The recording is
    closed at the end of train(). The Trainer has no event for an exception: a train() that raises keeps the
    steps recorded before it, but its run.json stays `running`, which `detlab compare` reports as incomplete.

    rng (on by default) records the random generators' states; `batches=True` (default) records the inputs the
    model's forward took in training (its tensor keyword arguments: input_ids, labels ...; a step's list of them
    with gradient accumulation). `train(resume_from_checkpoint=...)` restores global step K: the callback
    continues the recording in `out` (resume=True) and records the restored state of step K at the first step's
    beginning (after the Trainer restored its random states), so that `detlab compare` says whether the restore
    matched and what the resumed run lost.
    """

    _losses: list[torch.Tensor]
    _shares = False  # whether the step's losses are shares of its loss (summed) or means (averaged)
    _hook: torch.utils.hooks.RemovableHandle | None = None
    _inputs: list[dict[str, torch.Tensor]]
    _restored: int = 0  # the global step a resumed train() restored, until its state is recorded

    # The Trainer passes model, optimizer and the rest as keywords to every event.
    def on_train_begin(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                       **kwargs: Any) -> None:
        if self._grads and "on_pre_optimizer_step" not in vars(TrainerCallback):
            raise ValueError("DetlabCallback(grads=True) needs the Trainer's on_pre_optimizer_step event, which this "
                             "transformers lacks: upgrade transformers, or pass grads=False")
        self._unhook()
        optimizer = kwargs["optimizer"]
        self._start(getattr(optimizer, "optimizer", optimizer),  # the torch optimizer inside accelerate's wrapper
                    resumed_at=state.global_step)
        self._restored = state.global_step
        self._losses, self._inputs = [], []
        self._hook = kwargs["model"].register_forward_hook(self._catch_loss, with_kwargs=True)

    def _catch_loss(self, module: torch.nn.Module, inputs: Any, kwargs: dict[str, Any], output: Any) -> None:
        loss = output.get("loss") if isinstance(output, Mapping) else None  # a ModelOutput is a Mapping
        if module.training and isinstance(loss, torch.Tensor):
            self._losses.append(loss.detach())
            self._shares = kwargs.get("num_items_in_batch") is not None
        if module.training:
            self._inputs.append({k: v for k, v in kwargs.items() if isinstance(v, torch.Tensor)})

    def on_step_begin(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                      **kwargs: Any) -> None:
        self._losses, self._inputs = [], []
        if self._restored:  # the first step of a resumed train(): the Trainer has restored every state by now
            self._record_restored(self._restored, kwargs["model"])
            self._restored = 0

    def on_pre_optimizer_step(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                              **kwargs: Any) -> None:
        self._record_grads(state.global_step + 1, kwargs["model"])  # the step this optimizer.step() makes

    def on_step_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                    **kwargs: Any) -> None:
        losses, self._losses = self._losses, []
        inputs, self._inputs = self._inputs, []
        loss = None
        if losses:
            loss = torch.stack(losses).sum() if self._shares else torch.stack(losses).mean()
        self._record_step(state.global_step, kwargs["model"], loss, inputs[0] if len(inputs) == 1 else inputs)

    def on_train_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                     **kwargs: Any) -> None:
        self._unhook()
        self._end()

    def _unhook(self) -> None:
        if self._hook is not None:
            self._hook.remove()
            self._hook = None
