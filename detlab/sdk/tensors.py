"""Which tensors a step records, by name: parameters, buffers, optimizer state, gradients; filtered.

Names are the model's own (`fc1.weight`), taken from the model inside DDP, DataParallel and
torch.compile wrappers so that a wrapped and an unwrapped run compare. Buffers keep their names
(`bn.running_mean`); a parameter's gradient is `<parameter>.grad` and its optimizer state
`<parameter>.<state key>` (`fc1.weight.exp_avg`), as torch spells them.
"""

from __future__ import annotations

import fnmatch
import operator
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

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


class ModelTensors:
    """One model's parameters and buffers by name. The module tree is walked once; each later call checks
    in a few microseconds per hundred tensors that no module, parameter or buffer was added, removed or
    replaced since (object identity, held here so no id is reused), and walks again only if one was."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model
        self._inner = unwrap(model)
        self._dicts: list[dict[str, Any]] = []  # every module's parameters, buffers and children
        self._held: list[object] = []
        self._params: Named = []
        self._buffers: Named = []

    def _current(self) -> list[object]:
        return [v for d in self._dicts for v in d.values()]

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
    """Shape and dtype per tensor: what must stay as the first recorded step described it."""
    return [(t.shape, t.dtype) for _, t in named]


def describe(named: Named) -> list[tuple[str, list[int], str]]:
    """(name, shape, dtype) per tensor, as the tensors record and the comparison hold them."""
    return [(n, list(t.shape), str(t.dtype).removeprefix("torch.")) for n, t in named]
