"""Which tensors a step records, by name: parameters, buffers, optimizer state, gradients; filtered.

Names are the model's own (`fc1.weight`), taken from the model inside DDP, DataParallel and
torch.compile wrappers so that a wrapped and an unwrapped run compare. Buffers keep their names
(`bn.running_mean`); a parameter's gradient is `<parameter>.grad` and its optimizer state
`<parameter>.<state key>` (`fc1.weight.exp_avg`), as torch spells them.

A DTensor (FSDP2, tensor parallel) is recorded as this rank's local shard, with its placement; the
tensors that ranks hold as replicas (a DDP model's parameters, their gradients and optimizer state; a
DTensor's Replicate() mesh dimensions) are marked, for the check that the replicas agree.
"""

from __future__ import annotations

import fnmatch
import itertools
import operator
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, cast

from detlab.core.wire import Placement, TensorLayout

if TYPE_CHECKING:
    import torch

Named = list[tuple[str, "torch.Tensor"]]
NameFilter = str | Sequence[str] | Callable[[str], bool] | None


def name_filter(names: NameFilter) -> Callable[[str], bool]:
    """A predicate from glob pattern(s) (fnmatch, case-sensitive) or a predicate; None keeps every name."""
    if names is None:
        return lambda _name: True
    if callable(names):
        return names
    patterns = [names] if isinstance(names, str) else list(names)
    if not patterns or not all(isinstance(p, str) for p in patterns):
        raise TypeError("names= takes a glob pattern, a list of them, or a function of the name")
    return lambda name: any(fnmatch.fnmatchcase(name, p) for p in patterns)


def unwrap(model: torch.nn.Module) -> torch.nn.Module:
    """The user's module inside DDP / DataParallel / torch.compile wrappers."""
    import torch

    while True:
        if isinstance(model, (torch.nn.parallel.DistributedDataParallel, torch.nn.DataParallel)):
            model = model.module
        elif hasattr(model, "_orig_mod") and isinstance(model._orig_mod, torch.nn.Module):
            model = model._orig_mod  # torch.compile's OptimizedModule
        else:
            return model


def dtensor_type() -> type | None:
    """torch's DTensor class once torch.distributed.tensor is imported (no DTensor exists before); else None."""
    return getattr(sys.modules.get("torch.distributed.tensor"), "DTensor", None)


def local(tensors: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """What is hashed of each tensor: a DTensor's local shard on this rank, any other tensor itself."""
    import torch

    dtensor = dtensor_type()
    if dtensor is None:
        return list(tensors)
    with torch.no_grad():  # to_local() without autograd is the shard itself, not a copy
        return [cast(Any, t).to_local() if isinstance(t, dtensor) else t for t in tensors]


def ddp_ranks(model: torch.nn.Module) -> list[int] | None:
    """The ranks of the process group of the DDP wrapper around `model` (they hold replicas of its
    parameters), or None when there is no DDP wrapper."""
    import torch
    import torch.distributed as dist

    while True:
        if isinstance(model, torch.nn.parallel.DistributedDataParallel):
            return sorted(dist.get_process_group_ranks(model.process_group))
        if isinstance(model, torch.nn.DataParallel):
            model = model.module
        elif hasattr(model, "_orig_mod") and isinstance(model._orig_mod, torch.nn.Module):
            model = model._orig_mod
        else:
            return None


def dtensor_layout(t: Any) -> tuple[Placement, int | None]:
    """A DTensor's placement on this rank, and the lowest rank holding a bit-equal copy of its local tensor
    (the ranks that differ from this one only along Replicate() mesh dimensions; None when no other does)."""
    mesh, placements = t.device_mesh, list(t.placements)
    coordinate = mesh.get_coordinate()
    try:  # torch's own arithmetic for where a shard starts (private; the placement stands without it)
        from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

        offset: list[int] | None = list(compute_local_shape_and_global_offset(t.shape, mesh, t.placements)[1])
    except Exception:
        offset = None
    replica_of = None
    if coordinate is not None:
        at = tuple(slice(None) if p.is_replicate() else c for p, c in zip(placements, coordinate, strict=True))
        group = mesh.mesh[at].flatten().tolist()
        replica_of = min(group) if len(group) > 1 else None
    placement = Placement(mesh_shape=list(mesh.shape), placements=[repr(p)[:64] for p in placements],
                          coordinate=list(coordinate or []), global_shape=list(t.shape), offset=offset)
    return placement, replica_of


def layouts(named: Named, model: ModelTensors | None) -> list[TensorLayout]:
    """The DTensors and replicas among the recorded tensors, by index (the tensors record's `layouts`). Under
    DDP a parameter, its gradient and its optimizer state are replicas; buffers are not (BatchNorm updates
    its running statistics from each rank's own batch)."""
    dtensor = dtensor_type()
    ddp = model.replicas if model is not None else None
    params = {n for n, _ in model.parameters()} if ddp is not None and model is not None else set()
    out = []
    for i, (n, t) in enumerate(named):
        if dtensor is not None and isinstance(t, dtensor):
            placement, replica_of = dtensor_layout(t)
            out.append(TensorLayout(index=i, placement=placement, replica_of=replica_of))
        elif ddp is not None and (n in params or n.rpartition(".")[0] in params):
            out.append(TensorLayout(index=i, replica_of=ddp))
    return out


class ModelTensors:
    """One model's parameters and buffers by name. The module tree is walked once; each later call checks
    in a few microseconds per hundred tensors that no module, parameter or buffer was added, removed or
    replaced since (object identity, held here so no id is reused), and walks again only if one was."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model
        self._inner = unwrap(model)
        ranks = ddp_ranks(model)
        self.replicas = min(ranks) if ranks else None  # under DDP: the lowest rank of its process group
        self._dicts: list[dict[str, Any]] = []  # every module's parameters, buffers and children
        self._held: list[object] = []
        self._params: Named = []
        self._buffers: Named = []

    def _current(self) -> list[object]:
        return list(itertools.chain.from_iterable(map(dict.values, self._dicts)))

    def _refresh(self) -> None:
        held = self._current()
        if self._dicts and len(held) == len(self._held) and all(map(operator.is_, held, self._held)):
            return
        self._dicts = [d for m in self._inner.modules() for d in (m._parameters, m._buffers, m._modules)]
        self._held = self._current()
        self._params = list(self._inner.named_parameters())
        self._buffers = list(self._inner.named_buffers())

    def parameters(self) -> Named:
        """(name, parameter) as `named_parameters()` gives them."""
        self._refresh()
        return self._params

    def buffers(self) -> Named:
        """(name, buffer) as `named_buffers()` gives them."""
        self._refresh()
        return self._buffers

    def gradients(self) -> tuple[Named, list[str]]:
        """(name.grad, gradient) of every parameter that has one, and the names of those that have none."""
        found, lacking = [], []
        for n, p in self.parameters():
            if p.grad is None:
                lacking.append(n)
            else:
                found.append((f"{n}.grad", p.grad))
        return found, lacking

    def optimizer_state(self, optimizer: torch.optim.Optimizer) -> Named:
        """Every tensor of the optimizer's per-parameter state, in parameter-group order, keys sorted."""
        import torch

        names = {id(p): n for n, p in self.parameters()}
        out: Named = []
        for g, group in enumerate(optimizer.param_groups):
            for i, p in enumerate(group["params"]):
                state = optimizer.state.get(p)
                if not state:
                    continue
                base = names.get(id(p), f"optimizer.group{g}.param{i}")
                out += [(f"{base}.{key}", v) for key, v in sorted(state.items(), key=lambda kv: str(kv[0]))
                        if isinstance(v, torch.Tensor)]
        return out


def layout(named: Named) -> list[tuple[object, object]]:
    """Shape and dtype per tensor: what must stay as the first recorded step described it. A DTensor's shape
    is the global one: its placements stand beside it (a resharded tensor is another tensor)."""
    dtensor = dtensor_type()
    if dtensor is None:
        return [(t.shape, t.dtype) for _, t in named]
    return [((t.shape, cast(Any, t).placements) if isinstance(t, dtensor) else t.shape, t.dtype) for _, t in named]


def describe(named: Named) -> list[tuple[str, list[int], str]]:
    """(name, shape, dtype) per tensor, as the tensors record and the comparison hold them: a DTensor's
    shape is its local shard's."""
    shards = local([t for _, t in named])
    return [(n, list(t.shape), str(t.dtype).removeprefix("torch.")) for (n, _), t in zip(named, shards, strict=True)]


_DEVICE, _SHAPE, _DTYPE = operator.attrgetter("device"), operator.attrgetter("shape"), operator.attrgetter("dtype")


class ListKey:
    """What reading a list of tensors in place depends on, per tensor: device, data pointer, shape, strides, dtype,
    conj and neg bits. Two equal keys of the same tensor objects: the same list, read the same way. The recorder
    makes one a step (about 70 us for GPT-2's 148 tensors) and, where it equals the last step's, hands that one
    on: the launch-plan caches keyed by it then find their plan by a hash already known and an identity check."""

    __slots__ = ("_hash", "device", "parts")

    def __init__(self, tensors: Sequence[torch.Tensor]) -> None:
        import torch

        T = torch.Tensor  # noqa: N806
        devices = tuple(map(_DEVICE, tensors))
        self.parts = (devices, tuple(map(T.data_ptr, tensors)), tuple(map(_SHAPE, tensors)),
                      tuple(map(T.stride, tensors)), tuple(map(_DTYPE, tensors)), tuple(map(T.is_conj, tensors)),
                      tuple(map(T.is_neg, tensors)))  # fmt: skip
        # The one device the list lies on; None for an empty list or one on several devices.
        self.device = devices[0] if devices and devices.count(devices[0]) == len(devices) else None
        self._hash: int | None = None

    def __eq__(self, other: object) -> bool:
        return self is other or (isinstance(other, ListKey) and self.parts == other.parts)

    def __hash__(self) -> int:
        if self._hash is None:
            self._hash = hash(self.parts)
        return self._hash
