"""The probe of a `bisect` run: one training step recorded module call by module call.

Forward pre-hooks and hooks, and full backward pre-hooks and hooks, on every module keep a copy of each
tensor a call takes and gives, in the order the step produces them (entry names: detlab.core.bisect); the
loss, the parameters' gradients and the parameters after the optimizer step follow. Copies, because a tensor
a hook sees may be changed in place later in the step; digests are taken at the end, in one
`fingerprint_many` call, so no hook waits for the device. Only the probe step pays for any of this.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.distributed as dist
from torch.utils._pytree import tree_flatten
from torch.utils.hooks import RemovableHandle

from detlab.core.bisect import call_entry
from detlab.core.wire import StepRecord, TensorInfo, TensorsRecord
from detlab.tensors import fingerprint as fp

MAX_NAME = 255  # TensorInfo.name


def _tensors(value: Any) -> list[torch.Tensor]:
    """The tensors in a hook's argument (tuples, lists, dicts of them), in order; None and non-tensors skipped."""
    leaves, _ = tree_flatten(value)
    return [t for t in leaves if isinstance(t, torch.Tensor)]


class Probe:
    """Hooks on every module of `model`; `entries()` and `digests()` once the step is done."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.names: list[str] = []
        self.kept: list[torch.Tensor | list[torch.Tensor]] = []  # a list: a module's own state, combined
        self.dtypes: list[str] = []
        self._handles: list[RemovableHandle] = []
        self._calls: dict[tuple[str, str], int] = {}
        self._open: dict[tuple[str, str], list[int]] = {}
        for name, module in model.named_modules():
            own = [t.detach().clone() for t in (*module.parameters(recurse=False), *module.buffers(recurse=False))]
            self._add(f"state:{name}", own, type(module).__name__[:32])
            self._hook(name, module)

    def _add(self, name: str, value: torch.Tensor | list[torch.Tensor], dtype: str | None = None) -> None:
        if len(name) > MAX_NAME:
            raise ValueError(f"bisect: the entry name {name[:80]}... is over {MAX_NAME} characters")
        self.names.append(name)
        self.kept.append(value)
        if dtype is None:
            dtype = str(value.dtype).removeprefix("torch.") if isinstance(value, torch.Tensor) else "state"
        self.dtypes.append(dtype)

    def _keep(self, phase: str, module: str, call: int, slot: str, value: Any) -> None:
        for i, t in enumerate(_tensors(value)):
            self._add(call_entry(phase, module, call, f"{slot}{i}"), t.detach().clone())  # type: ignore[arg-type]

    def _begin(self, phase: str, module: str) -> int:
        call = self._calls.get((phase, module), 0)
        self._calls[(phase, module)] = call + 1
        self._open.setdefault((phase, module), []).append(call)  # calls of one module nest: a stack
        return call

    def _hook(self, name: str, module: torch.nn.Module) -> None:
        def fwd_pre(_m: torch.nn.Module, args: Any, kwargs: Any) -> None:
            self._keep("fwd", name, self._begin("fwd", name), "in", (args, kwargs))

        def fwd(_m: torch.nn.Module, _args: Any, output: Any) -> None:
            self._keep("fwd", name, self._open[("fwd", name)].pop(), "out", output)

        def bwd_pre(_m: torch.nn.Module, grad_output: Any) -> None:
            self._keep("bwd", name, self._begin("bwd", name), "gout", grad_output)

        def bwd(_m: torch.nn.Module, grad_input: Any, _grad_output: Any) -> None:
            self._keep("bwd", name, self._open[("bwd", name)].pop(), "gin", grad_input)

        self._handles += [module.register_forward_pre_hook(fwd_pre, with_kwargs=True),
                          module.register_forward_hook(fwd),
                          module.register_full_backward_pre_hook(bwd_pre),
                          module.register_full_backward_hook(bwd)]

    def loss(self, loss: torch.Tensor) -> None:
        self._add("loss", loss.detach().clone())

    def grads(self, named: list[tuple[str, torch.nn.Parameter]]) -> None:
        """The parameters' gradients as the optimizer will take them (after DDP's all-reduce)."""
        self.remove()  # backward is over: nothing after this is a module call
        for name, p in named:
            if p.grad is not None:
                self._add(f"grad:{name}", p.grad.detach().clone())

    def params(self, named: list[tuple[str, torch.nn.Parameter]]) -> None:
        """The parameters after the optimizer step (and any fault injected after it)."""
        for name, p in named:
            self._add(f"param:{name}", p.detach().clone())

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []

    def records(self, step: int, rank: int, loss: float | None, loss_bits: str, seconds: float,
                ) -> tuple[TensorsRecord, StepRecord]:
        """The probe step's entry list and step record, once every rank is known to have made the same calls (one
        list is stored per run: a rank whose calls differ could not be read with it)."""
        tensors, packed = self.digests()
        same_calls([t.name for t in tensors.tensors], rank, step)
        return tensors, StepRecord(step=step, rank=rank, fp_version=fp.FP_VERSION,
                                   model_digest=fp.fingerprint_bytes(packed), digests=packed.hex(),
                                   loss_bits=loss_bits, loss=loss if loss is not None and math.isfinite(loss) else None,
                                   step_time_s=max(seconds, 0.0))

    def digests(self) -> tuple[TensorsRecord, bytes]:
        """The entry list and the packed digests (16 bytes per entry, in its order): one fingerprint call."""
        flat: list[torch.Tensor] = []
        spans = []
        for value in self.kept:
            items = value if isinstance(value, list) else [value]
            spans.append((len(flat), len(items), isinstance(value, list)))
            flat += items
        digests = [fp.digest_to_bytes(d) for d in fp.fingerprint_many(flat)] if flat else []
        packed = []
        for start, n, combined in spans:
            part = digests[start : start + n]
            # A module's own state is one entry: the digest of its tensors' digests (of nothing: no tensors).
            packed.append(fp.digest_to_bytes(fp.fingerprint_bytes(b"".join(part))) if combined else part[0])
        infos = [TensorInfo(index=i, name=name, dtype=dtype,
                            shape=[len(v)] if isinstance(v, list) else list(v.shape))
                 for i, (name, v, dtype) in enumerate(zip(self.names, self.kept, self.dtypes, strict=True))]
        return TensorsRecord(tensors=infos), b"".join(packed)


def same_calls(names: list[str], rank: int, step: int) -> None:
    """Raise unless every rank of the process group (if there is one) recorded these entries."""
    if not dist.is_available() or not dist.is_initialized():
        return
    lists: list[list[str] | None] = [None] * dist.get_world_size()
    dist.all_gather_object(lists, names)
    for other, theirs in enumerate(lists):
        if theirs != names:
            at = next((i for i, (x, y) in enumerate(zip(names, theirs or [], strict=False)) if x != y),
                      min(len(names), len(theirs or [])))
            raise RuntimeError(f"bisect: rank {other} made other module calls than rank {rank} at step {step} "
                               f"(from entry {at}); the probe needs the same calls on every rank")
