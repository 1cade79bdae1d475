"""Batch invariance: does an op give sample 0 the same bits alone as inside a batch?

Per op, dtype and batch size b: the op runs on the first b rows of one seeded input (the largest batch,
made once) and row 0 of its result is compared with the result for the first row alone, bit for bit, and
in units in the last place (ULP: the floats' bit patterns as ordered integers, their largest distance).
Everything runs where the tensors live (a GPU when asked): only one integer per cell comes back.

`model_invariance` does the same for a workload's forward: forward hooks keep each module call's output
for sample 0, alone and inside a batch, and the first module (in call order) whose output differs names
where invariance breaks.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any, Protocol

import torch
from torch.nn import functional as F

from detlab.core.diagnosis import InvarianceDtype, InvarianceOp, sdpa_geometry
from detlab.core.wire import InvarianceRecord, ModelInvarianceRecord


class Workload(Protocol):
    """What the model check needs of a workload (a built-in one, or a script's model through detlab's SDK)."""

    name: str

    def batch(self, step: int, seed: int, device: torch.device) -> tuple[torch.Tensor, ...]: ...

    def loss(self, model: torch.nn.Module, batch: tuple[torch.Tensor, ...]) -> Any: ...

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
_INT_VIEW = {torch.float32: torch.int32, torch.bfloat16: torch.int16, torch.float16: torch.int16}


def ordered_bits(x: torch.Tensor) -> torch.Tensor:
    """A float tensor's bit patterns as int64 integers in the floats' order (-0.0 and +0.0 one apart)."""
    bits = x.contiguous().view(_INT_VIEW[x.dtype]).to(torch.int64)
    sign_mask = torch.iinfo(_INT_VIEW[x.dtype]).min  # the sign bit alone, negative
    # A negative float's magnitude bits grow away from zero: mirror them below zero, -0.0 at -1.
    return torch.where(bits < 0, sign_mask - bits - 1, bits)


def max_ulp(a: torch.Tensor, b: torch.Tensor) -> int:
    """The largest distance between corresponding elements of two same-dtype tensors, in ULP (0: equal bits)."""
    if a.shape != b.shape:
        raise ValueError(f"shapes differ: {tuple(a.shape)} vs {tuple(b.shape)}")
    if a.numel() == 0:
        return 0
    return int((ordered_bits(a) - ordered_bits(b)).abs().max().item())


class Inputs:
    """The seeded operands of every op at one dtype: the largest batch of samples and the shared weights."""

    def __init__(self, features: int, max_batch: int, dtype: torch.dtype, device: torch.device, seed: int) -> None:
        g = torch.Generator().manual_seed(seed)
        f = features

        def randn(*shape: int, scale: float = 1.0) -> torch.Tensor:
            # generated on the CPU (one stream whatever the device), then moved
            return (torch.randn(*shape, generator=g) * scale).to(device=device, dtype=dtype)

        self.x = randn(max_batch, f)
        self.weight = randn(f, f, scale=f ** -0.5)
        self.bias = randn(f)
        self.gain = randn(f).abs_().add_(0.5)
        self.heads, self.tokens, self.head_dim = sdpa_geometry(f)


def _sdpa(x: torch.Tensor, inp: Inputs) -> torch.Tensor:
    q = x.view(x.shape[0], inp.heads, inp.tokens, inp.head_dim)
    return F.scaled_dot_product_attention(q, q * 0.5, q, is_causal=True)


# op -> what it computes from the first b samples; every result's dim 0 is the sample.
OP_FUNCS: dict[str, Callable[[torch.Tensor, Inputs], torch.Tensor]] = {
    "mm": lambda x, i: torch.mm(x, i.weight),
    "linear": lambda x, i: F.linear(x, i.weight, i.bias),
    # bmm and matmul see each sample as a (tokens, features/tokens) matrix times one shared weight
    "bmm": lambda x, i: torch.bmm(x.view(x.shape[0], i.tokens, -1),
                                  i.weight[: x.shape[1] // i.tokens, : x.shape[1] // i.tokens]
                                  .expand(x.shape[0], -1, -1)),
    "matmul": lambda x, i: torch.matmul(x.view(x.shape[0], i.tokens, -1),
                                        i.weight[: x.shape[1] // i.tokens, : x.shape[1] // i.tokens]),
    "addmm": lambda x, i: torch.addmm(i.bias, x, i.weight),
    "log_softmax": lambda x, i: torch.log_softmax(x, dim=-1),
    "softmax": lambda x, i: torch.softmax(x, dim=-1),
    "mean": lambda x, i: x.mean(dim=-1),
    "sum": lambda x, i: x.sum(dim=-1),
    "layer_norm": lambda x, i: F.layer_norm(x, (x.shape[1],), i.gain, i.bias),
    "rms_norm": lambda x, i: F.rms_norm(x, (x.shape[1],), i.gain),
    "sdpa": _sdpa,
}


def op_invariance(ops: Sequence[InvarianceOp], dtypes: Sequence[InvarianceDtype], batch_sizes: Sequence[int],
                  features: int, device: torch.device, seed: int = 0) -> Iterator[InvarianceRecord]:
    """One record per (op, dtype, batch size), in that order; batch size 1 is invariant by definition."""
    largest = max(batch_sizes)
    for dtype in dtypes:
        inputs = Inputs(features, largest, DTYPES[dtype], device, seed)
        for op in ops:
            fn = OP_FUNCS[op]
            with torch.no_grad():
                alone = fn(inputs.x[:1], inputs)[0].clone()
                for b in batch_sizes:
                    row = fn(inputs.x[:b], inputs)[0]
                    ulp = max_ulp(row, alone)
                    yield InvarianceRecord(op=op, dtype=dtype, batch_size=b, features=features, invariant=ulp == 0,
                                           max_ulp=ulp)
            del alone


def _first_tensor(out: object) -> torch.Tensor | None:
    if isinstance(out, torch.Tensor):
        return out
    if isinstance(out, (tuple, list)):
        return next((t for t in map(_first_tensor, out) if t is not None), None)
    return None


def _module_outputs(model: torch.nn.Module, run: Callable[[], object]) -> list[tuple[str, torch.Tensor]]:
    """Every module call's first output tensor, in call order, as (module name, detached copy)."""
    seen: list[tuple[str, torch.Tensor]] = []
    hooks = []
    for name, module in model.named_modules():
        def hook(_m: torch.nn.Module, _args: object, out: object, name: str = name or "(model)") -> None:
            t = _first_tensor(out)
            if t is not None and t.is_floating_point():
                seen.append((name, t.detach().clone()))
        hooks.append(module.register_forward_hook(hook))
    try:
        with torch.no_grad():
            run()
    finally:
        for h in hooks:
            h.remove()
    return seen


def _samples(workload: Workload, count: int, seed: int, device: torch.device) -> tuple[torch.Tensor, ...]:
    """`count` samples of the workload, from as many of its global batches as it takes."""
    parts, have, step = [], 0, 1
    while have < count:
        parts.append(workload.batch(step, seed, device))
        have += parts[-1][0].shape[0]
        step += 1
    return tuple(torch.cat(ts)[:count] for ts in zip(*parts, strict=True))


def model_invariance(workload: Workload, model: torch.nn.Module, batch_sizes: Sequence[int], device: torch.device,
                     seed: int = 0) -> Iterator[ModelInvarianceRecord]:
    """Per batch size: sample 0's output of every module call, alone and as the first of a batch, compared in
    call order. A module output whose first dimension is not samples × k (a loss, a mean) is not compared."""
    largest = max(batch_sizes)
    samples = _samples(workload, largest, seed, device)
    model.eval()

    def run(b: int) -> Callable[[], object]:
        return lambda: workload.loss(model, tuple(t[:b] for t in samples))

    alone = _module_outputs(model, run(1))
    for b in batch_sizes:
        # the k-th call of a module alone against its k-th call in the batch: a model that loops over samples
        # calls a module once per sample, and its first call is sample 0's
        calls: dict[str, list[torch.Tensor]] = {}
        for name, out in _module_outputs(model, run(b)):
            calls.setdefault(name, []).append(out)
        seen: dict[str, int] = {}
        first, compared = None, 0
        for name, one in alone:
            k = seen[name] = seen.get(name, -1) + 1
            if k >= len(calls.get(name, [])):
                continue
            many = calls[name][k]
            rows = one.shape[0] if one.dim() else 0
            if many.shape == one.shape:
                part = many  # the same sample's call (or a batch of 1)
            elif rows and many.shape[1:] == one.shape[1:] and many.shape[0] == rows * b:
                part = many[:rows]  # sample 0's rows of a batched call
            else:
                continue  # not per-sample rows (a loss, a mean over the batch)
            compared += 1
            if first is None and max_ulp(part, one):
                first = name
        yield ModelInvarianceRecord(workload=workload.name, batch_size=b, invariant=first is None,
                                    first_module=first, modules_compared=compared)
