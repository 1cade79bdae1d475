"""detlab.Recorder in a registered script that a worker runs as a bisect (DETLAB_PROBE_STEP set by the worker).

As the built-in ranks do (worker/ranks/train.py): each step before the probe step is recorded by its model digest
alone; `rec.step(N-1, ...)` puts the hooks on every module (detlab/tensors/probe.py), so they see step N's forward and
backward; `rec.step(N, ...)` adds the loss, the gradients and the parameters and writes the probe's entry list and
step record; later steps are not recorded. Scripts give the loss at `rec.step`, so their `loss` entry comes after
the backward calls (the same in both runs, which is all a comparison needs).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from detlab.core.wire import StepRecord

if TYPE_CHECKING:
    import torch

    from detlab.sdk.spool import Job
    from detlab.tensors.digests import Digester
    from detlab.tensors.probe import Probe


def _unwrapped(model: torch.nn.Module) -> torch.nn.Module:
    # DDP's own module is its model: hooks go on the model's modules, not on the wrapper.
    inner = getattr(model, "module", None)
    return inner if type(model).__name__ == "DistributedDataParallel" and inner is not None else model


class Probing:
    """The Recorder's steps in a bisect run probing step `probe_step`."""

    def __init__(self, probe_step: int) -> None:
        self.probe_step = probe_step
        self.probe: Probe | None = None

    def step(self, *, step: int, model: torch.nn.Module, loss: Any, seconds: float, rank: int,
             put: Callable[[Job], None], digester: Digester, loss_bits: Callable[[float | None], str],
             ) -> None:
        from detlab.tensors import fingerprint as fp
        from detlab.tensors.probe import Probe

        if step > self.probe_step:
            return
        model = _unwrapped(model)
        if step < self.probe_step:
            pending = digester.submit([p for _, p in model.named_parameters()])

            def record() -> StepRecord:
                packed = pending.packed()
                return StepRecord(step=step, rank=rank, fp_version=fp.FP_VERSION, digests="", loss_bits="",
                                  model_digest=fp.fingerprint_bytes(packed), step_time_s=max(seconds, 0.0))

            put(record)
            if step == self.probe_step - 1:
                self.probe = Probe(model)  # step N's forward and backward come next
            return
        if self.probe is None:
            raise ValueError(f"detlab bisect: step {step} is probed, but rec.step({step - 1}, ...) was never called to "
                             "put the hooks on the model before it")
        named = list(model.named_parameters())
        if loss is not None and hasattr(loss, "detach"):
            self.probe.loss(loss)
        self.probe.grads(named)
        self.probe.params(named)
        value = float(loss) if loss is not None else None
        tensors, stepped = self.probe.records(step, rank, value, loss_bits(value), seconds)
        put(lambda: tensors)
        put(lambda: stepped)
