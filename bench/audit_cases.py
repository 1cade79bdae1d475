"""The op audit's engine (detlab.tensors.audit.audit_step) over cases whose truth is known: PyTorch's
documented nondeterministic CUDA ops, deterministic controls, and random draws (explicit generators, dropout,
attention's dropout) that must never be called nondeterministic. One row per case: what was expected, whether
the audit flagged it, whether PyTorch's own alert fired, how many distinct results the re-runs gave, and whether
the audit was right.

    python bench/audit_cases.py [--device auto|cpu|cuda] [--reruns 10] [--json PATH]

On a machine without CUDA the CUDA-only cases are skipped (listed as such). The JSON goes to PATH, or to
$OUT/audit_cases.json when $OUT is set. Exit 0 when every case that ran was judged right, 1 otherwise.

Expectations: `nondeterministic` cases name the op that races (its row must be flagged, by PyTorch's alert or by
re-runs that differ); `alert` says whether PyTorch documents an error for it under
torch.use_deterministic_algorithms(True) on this device. `deterministic` cases (controls and random draws) must
have no op of the step flagged. `unknown` cases are reported, not judged.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F  # noqa: N812 - PyTorch's own spelling

from detlab.tensors.audit import audit_step

Step = Callable[[], object]
N = 1 << 20  # values added into SLOTS targets: threads race on the same few addresses
SLOTS = 16


@dataclass
class Case:
    """One case: how to build its step on a device, what the audit should say of it."""

    name: str
    build: Callable[[torch.device], Step]
    expected: str  # nondeterministic | deterministic | unknown
    ops: tuple[str, ...] = ()  # the racing op(s) of a nondeterministic case (any of them flagged counts)
    alert: bool = False  # PyTorch documents an error for it under use_deterministic_algorithms(True)
    cuda_only: bool = True
    deterministic_flag: bool = False  # the step runs with use_deterministic_algorithms(True)
    env: dict[str, str | None] = field(default_factory=dict)  # set (None: unset) around the audit


def _contended(device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator(device=device).manual_seed(0)
    index = torch.randint(0, SLOTS, (N,), generator=g, device=device)
    return index, torch.randn(N, generator=g, device=device)


def index_add(d: torch.device) -> Step:
    index, values = _contended(d)
    return lambda: torch.zeros(SLOTS, device=d).index_add_(0, index, values)


def scatter_add(d: torch.device) -> Step:
    index, values = _contended(d)
    return lambda: torch.zeros(SLOTS, device=d).scatter_add_(0, index, values)


def index_put_accumulate(d: torch.device) -> Step:
    index, values = _contended(d)
    return lambda: torch.zeros(SLOTS, device=d).index_put_((index,), values, accumulate=True)


def scatter_reduce_sum(d: torch.device) -> Step:
    index, values = _contended(d)
    return lambda: torch.zeros(SLOTS, device=d).scatter_reduce_(0, index, values, "sum")


def index_copy(d: torch.device) -> Step:
    index, values = _contended(d)  # duplicate indices: which write lands is the schedule's
    return lambda: torch.zeros(SLOTS, device=d).index_copy_(0, index, values)


def put_accumulate(d: torch.device) -> Step:
    index, values = _contended(d)
    return lambda: torch.zeros(SLOTS, device=d).put_(index, values, accumulate=True)


def put(d: torch.device) -> Step:
    index, values = _contended(d)
    return lambda: torch.zeros(SLOTS, device=d).put_(index, values)


def gather_backward(d: torch.device) -> Step:
    index, _ = _contended(d)
    x = torch.randn(SLOTS, device=d, requires_grad=True)
    weights = torch.randn(N, device=d)
    return lambda: (x.gather(0, index) * weights).sum().backward()


def histc(d: torch.device) -> Step:
    x = torch.randn(N, device=d)
    return lambda: torch.histc(x, bins=SLOTS)


def bincount_weights(d: torch.device) -> Step:
    index, values = _contended(d)
    return lambda: torch.bincount(index, weights=values)


def kthvalue(d: torch.device) -> Step:
    x = torch.randn(4096, device=d)
    return lambda: torch.kthvalue(x, 100)


def cumsum(d: torch.device) -> Step:
    x = torch.randn(N, device=d)
    return lambda: torch.cumsum(x, 0)


def _grad_of(d: torch.device, shape: tuple[int, ...], forward: Callable[[torch.Tensor], torch.Tensor]) -> Step:
    x = torch.randn(*shape, device=d, requires_grad=True)
    upstream = torch.randn_like(forward(x.detach()))
    return lambda: forward(x).backward(upstream)


def adaptive_avg_pool2d_backward(d: torch.device) -> Step:
    return _grad_of(d, (8, 32, 64, 64), lambda x: F.adaptive_avg_pool2d(x, 7))


def avg_pool3d_backward(d: torch.device) -> Step:
    return _grad_of(d, (4, 16, 32, 32, 32), lambda x: F.avg_pool3d(x, 3, stride=1))


def max_pool3d_backward(d: torch.device) -> Step:
    return _grad_of(d, (4, 16, 32, 32, 32), lambda x: F.max_pool3d(x, 3, stride=1))


def upsample_bilinear2d_backward(d: torch.device) -> Step:
    return _grad_of(d, (8, 32, 32, 32), lambda x: F.interpolate(x, scale_factor=3, mode="bilinear"))


def reflection_pad2d_backward(d: torch.device) -> Step:
    return _grad_of(d, (8, 32, 32, 32), lambda x: F.pad(x, (8, 8, 8, 8), mode="reflect"))


def grid_sampler_2d_backward(d: torch.device) -> Step:
    grid = torch.rand(8, 64, 64, 2, device=d, generator=torch.Generator(device=d).manual_seed(1)) * 0.2 - 0.1
    return _grad_of(d, (8, 32, 16, 16), lambda x: F.grid_sample(x, grid, align_corners=False))


def nll_loss2d(d: torch.device) -> Step:
    logits = torch.randn(8, 16, 64, 64, device=d).log_softmax(1)
    target = torch.randint(0, 16, (8, 64, 64), device=d)
    return lambda: F.nll_loss(logits, target)


def ctc_loss_backward(d: torch.device) -> Step:
    logits = torch.randn(50, 16, 20, device=d).log_softmax(2).detach().requires_grad_()
    targets = torch.randint(1, 20, (16, 30), device=d)
    lengths = torch.full((16,), 50, device=d, dtype=torch.long), torch.full((16,), 30, device=d, dtype=torch.long)
    return lambda: F.ctc_loss(logits, targets, *lengths).backward()


def matmul(d: torch.device) -> Step:
    a, b = torch.randn(512, 512, device=d), torch.randn(512, 512, device=d)
    return lambda: a @ b


def linear_backward(d: torch.device) -> Step:
    layer = torch.nn.Linear(256, 256, device=d)
    x = torch.randn(64, 256, device=d)
    return lambda: layer(x).square().sum().backward()


def layer_norm_softmax(d: torch.device) -> Step:
    x = torch.randn(64, 1024, device=d, requires_grad=True)
    return lambda: F.layer_norm(x, (1024,)).softmax(-1).square().sum().backward()


def reductions(d: torch.device) -> Step:
    x = torch.randn(N, device=d)
    return lambda: (x.sum(), x.mean(), x.norm())


def randn_generator(d: torch.device) -> Step:
    g = torch.Generator(device=d).manual_seed(7)
    return lambda: torch.randn(4096, generator=g, device=d)


def randint_generator(d: torch.device) -> Step:
    g = torch.Generator(device=d).manual_seed(7)
    return lambda: torch.randint(0, 1000, (4096,), generator=g, device=d)


def draws_generator(d: torch.device) -> Step:
    g = torch.Generator(device=d).manual_seed(7)
    probs = torch.ones(64, device=d)
    return lambda: (torch.empty(4096, device=d).normal_(generator=g),
                    torch.rand(4096, generator=g, device=d).bernoulli_(0.5, generator=g),
                    torch.multinomial(probs, 16, generator=g), torch.randperm(256, generator=g, device=d))


def dropout(d: torch.device) -> Step:
    x = torch.ones(4096, device=d)
    return lambda: F.dropout(x, 0.5)


def sdpa_dropout(d: torch.device) -> Step:
    q, k, v = (torch.randn(4, 8, 128, 64, device=d, dtype=torch.float16) for _ in range(3))
    return lambda: F.scaled_dot_product_attention(q, k, v, dropout_p=0.1)


DET = "deterministic"
NONDET = "nondeterministic"
CASES = [
    # racing ops with a deterministic alternative under the flag: re-runs must show it
    Case("index_add_", index_add, NONDET, ("aten.index_add_",)),
    Case("scatter_add_", scatter_add, NONDET, ("aten.scatter_add_",)),
    Case("index_put_ accumulate", index_put_accumulate, NONDET, ("aten.index_put_", "aten._index_put_impl_")),
    Case("scatter_reduce_ sum", scatter_reduce_sum, NONDET, ("aten.scatter_reduce_",)),
    Case("index_copy_ duplicates", index_copy, NONDET, ("aten.index_copy_",)),
    Case("put_ accumulate", put_accumulate, NONDET, ("aten.put_",)),
    Case("gather backward", gather_backward, NONDET, ("aten.scatter_add", "aten.scatter_add_")),
    # ops PyTorch raises for under use_deterministic_algorithms(True)
    Case("put_", put, NONDET, ("aten.put_",), alert=True, cuda_only=False),
    Case("histc", histc, NONDET, ("aten.histc",), alert=True),
    Case("bincount weights", bincount_weights, NONDET, ("aten.bincount",), alert=True),
    Case("kthvalue", kthvalue, NONDET, ("aten.kthvalue",), alert=True),
    Case("adaptive_avg_pool2d backward", adaptive_avg_pool2d_backward, NONDET,
         ("aten._adaptive_avg_pool2d_backward",), alert=True),
    Case("avg_pool3d backward", avg_pool3d_backward, NONDET, ("aten.avg_pool3d_backward",), alert=True),
    Case("max_pool3d backward", max_pool3d_backward, NONDET, ("aten.max_pool3d_with_indices_backward",),
         alert=True),
    Case("upsample_bilinear2d backward", upsample_bilinear2d_backward, NONDET,
         ("aten.upsample_bilinear2d_backward",), alert=True),
    Case("reflection_pad2d backward", reflection_pad2d_backward, NONDET, ("aten.reflection_pad2d_backward",),
         alert=True),
    Case("grid_sampler_2d backward", grid_sampler_2d_backward, NONDET, ("aten.grid_sampler_2d_backward",),
         alert=True),
    Case("nll_loss2d", nll_loss2d, NONDET, ("aten.nll_loss2d_forward",), alert=True),
    Case("ctc_loss backward", ctc_loss_backward, NONDET, ("aten._ctc_loss_backward",), alert=True),
    Case("mm without CUBLAS_WORKSPACE_CONFIG", matmul, NONDET, ("aten.mm",), alert=True,
         env={"CUBLAS_WORKSPACE_CONFIG": None}),
    Case("cumsum", cumsum, "unknown", ("aten.cumsum",)),
    # controls: deterministic kernels, and racing ops under the deterministic flag
    Case("mm with CUBLAS_WORKSPACE_CONFIG", matmul, DET, cuda_only=False, env={"CUBLAS_WORKSPACE_CONFIG": ":4096:8"}),
    Case("linear forward+backward", linear_backward, DET, cuda_only=False,
         env={"CUBLAS_WORKSPACE_CONFIG": ":4096:8"}),
    Case("layer_norm+softmax backward", layer_norm_softmax, DET, cuda_only=False),
    Case("sum, mean, norm", reductions, DET, cuda_only=False),
    Case("index_add_ under the flag", index_add, DET, deterministic_flag=True),
    Case("scatter_add_ under the flag", scatter_add, DET, deterministic_flag=True),
    Case("index_put_ accumulate under the flag", index_put_accumulate, DET, cuda_only=False,
         deterministic_flag=True),
    # random draws: a draw is not nondeterminism
    Case("randn generator=", randn_generator, DET, cuda_only=False),
    Case("randint generator=", randint_generator, DET, cuda_only=False),
    Case("normal_, bernoulli_, multinomial, randperm generator=", draws_generator, DET, cuda_only=False),
    Case("dropout", dropout, DET, cuda_only=False),
    Case("sdpa dropout (fp16)", sdpa_dropout, DET),
]


class _Env:
    """Sets (None: unsets) environment variables for a block."""

    def __init__(self, values: dict[str, str | None]) -> None:
        self.values = values

    def __enter__(self) -> None:
        self.before = {k: os.environ.get(k) for k in self.values}
        for key, value in self.values.items():
            os.environ.pop(key, None) if value is None else os.environ.__setitem__(key, value)

    def __exit__(self, *_exc: object) -> None:
        for key, value in self.before.items():
            os.environ.pop(key, None) if value is None else os.environ.__setitem__(key, value)


def run_case(case: Case, device: torch.device, reruns: int) -> dict[str, Any]:
    """The audit of one case and its judgement."""
    row: dict[str, Any] = {"case": case.name, "device": device.type, "expected": case.expected,
                           "alert_documented": case.alert if device.type == "cuda" or not case.cuda_only else None}
    if case.cuda_only and device.type != "cuda":
        return {**row, "skipped": "CUDA only"}
    before = torch.are_deterministic_algorithms_enabled()
    try:
        with _Env(case.env):
            step = case.build(device)
            torch.use_deterministic_algorithms(case.deterministic_flag)
            try:
                records = list(audit_step(step, reruns=reruns, calls_per_op=1))
            finally:
                torch.use_deterministic_algorithms(before)
    except Exception as exc:  # a case this stack cannot run: reported, not judged
        return {**row, "error": f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"}
    flagged_ops = [r for r in records if r.nondeterministic]
    targets = [r for r in records if r.op in case.ops]
    if case.ops:
        flagged = any(r.nondeterministic for r in targets) if targets else None
        alert = any(bool(r.alert) for r in targets) if targets else None
        distinct = max((r.distinct or 0 for r in targets), default=0) or None
        evidence = "; ".join(f"{r.op}: {r.evidence}" for r in targets) or f"op(s) {case.ops} not run"
    else:
        flagged, alert, distinct = bool(flagged_ops), any(bool(r.alert) for r in records), None
        evidence = "; ".join(f"{r.op}: {r.evidence}" for r in flagged_ops)
    right = None if case.expected == "unknown" else flagged == (case.expected == NONDET)
    return {**row, "flagged": flagged, "alert": alert, "distinct": distinct, "right": right,
            "flagged_ops": [r.op for r in flagged_ops], "evidence": evidence[:400]}


def table(rows: list[dict[str, Any]]) -> str:
    def cell(value: object) -> str:
        return "-" if value is None else "yes" if value is True else "no" if value is False else str(value)

    head = ("case", "expected", "flagged", "alert", "documented alert", "distinct", "right")
    lines = [" | ".join(head), " | ".join("---" for _ in head)]
    for row in rows:
        if "skipped" in row or "error" in row:
            lines.append(f"{row['case']} | {row['expected']} | {row.get('skipped') or row['error']} | | | |")
            continue
        lines.append(" | ".join(cell(row[k]) for k in ("case", "expected", "flagged", "alert", "alert_documented",
                                                         "distinct", "right")))
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    parser.add_argument("--reruns", type=int, default=10)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--only", help="run the cases whose name contains this")
    args = parser.parse_args()
    name = "cuda" if args.device == "auto" and torch.cuda.is_available() else args.device.replace("auto", "cpu")
    device = torch.device(name)
    rows = [run_case(c, device, args.reruns) for c in CASES if not args.only or args.only in c.name]
    stack = {"torch": torch.__version__, "cuda": torch.version.cuda,
             "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
             "threads": torch.get_num_threads(), "reruns": args.reruns}
    print(json.dumps(stack))
    print(table(rows))
    judged = [r for r in rows if r.get("right") is not None]
    wrong = [r["case"] for r in judged if not r["right"]]
    print(f"{len(judged) - len(wrong)} of {len(judged)} judged cases right" + (f"; wrong: {wrong}" if wrong else ""))
    path = args.json or (Path(os.environ["OUT"]) / "audit_cases.json" if os.environ.get("OUT") else None)
    if path:
        path.write_text(json.dumps({"stack": stack, "cases": rows}, indent=1))
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
