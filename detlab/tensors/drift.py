"""Per-tensor statistics and count sketches (detlab.core.sketch, `cs1`) of a tensor list, where it lives.

One pass over the list per device, batched: the tensors are copied, in chunks of at most CHUNK_ROWS rows of
sketch.COLUMNS elements, into one float64 scratch matrix (one fused `_foreach_copy_` per chunk; only each
tensor's last row is padded with zeros); one matrix product with the signed one-hot column map gives every
row's K bucket sums and its plain sum, a norm gives its sum of squares and its max |x|. Rows are then rotated
and signed by their row map and added up per tensor (index_add_, deterministic under torch's deterministic
mode; otherwise its float64 atomics reorder additions at the 1e-16 level, far below what the sketch measures,
and two runs whose digests are equal are known to be at distance 0 regardless).

On the CPU, where numba is installed, detlab.tensors.drift_numba computes the same values on the calling thread
alone (the recorder calls it on its writer thread, beside the training loop's own threads).

Nothing waits for the device: `Sketcher.submit` queues the work on the current stream and a copy of the
results to pinned host memory, and returns a function that waits for that copy alone (as detlab.tensors.digests).
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import numpy as np
import torch

from detlab.core import sketch
from detlab.tensors import drift_numba
from detlab.tensors.digests import recorded_event

CHUNK_ROWS = 4096  # 16M elements: a 128 MiB float64 scratch matrix
KEPT_LAYOUTS = 8


@dataclass
class _Plan:
    """What a tensor list's layout fixes: the maps on the device and the chunks' pieces."""

    columns: torch.Tensor  # [COLUMNS, K + 1]: signed one-hot bucket of each column, then a column of ones
    row_sign: torch.Tensor  # [rows]
    rotation: torch.Tensor  # [rows, K]: where each of a row's K sums goes
    row_tensor: torch.Tensor  # [rows]: the tensor a row belongs to
    # per chunk: its rows and (tensor index, first element, last element + 1, first row in the chunk)
    chunks: list[tuple[int, list[tuple[int, int, int, int]]]]
    tensors: int


def _plan(numels: list[int], indices: list[int], device: torch.device) -> _Plan:
    """`indices`: each tensor's index in the recorded list (the row map depends on it)."""
    b1, s1 = sketch.column_map()
    columns = np.zeros((sketch.COLUMNS, sketch.K + 1))
    columns[np.arange(sketch.COLUMNS), b1] = s1
    columns[:, sketch.K] = 1.0
    signs, rotations, owners = [], [], []
    chunks: list[tuple[int, list[tuple[int, int, int, int]]]] = []
    used, pieces = 0, []
    for t, (n, index) in enumerate(zip(numels, indices, strict=True)):
        rows = sketch.rows_of(n)
        b2, s2 = sketch.row_map(index, rows)
        signs.append(s2)
        # Row sum j of bucket c' lands in bucket (c' + b2) mod K: bucket c takes column (c - b2) mod K.
        rotations.append((np.arange(sketch.K)[None, :] - b2[:, None]) % sketch.K)
        owners.append(np.full(rows, t))
        row = 0
        while row < rows:
            take = min(rows - row, CHUNK_ROWS - used)
            pieces.append((t, row * sketch.COLUMNS, min(n, (row + take) * sketch.COLUMNS), used))
            used, row = used + take, row + take
            if used == CHUNK_ROWS:
                chunks.append((used, pieces))
                used, pieces = 0, []
    if pieces:
        chunks.append((used, pieces))

    def on(x: np.ndarray, dtype: torch.dtype) -> torch.Tensor:
        return torch.from_numpy(np.ascontiguousarray(x)).to(device=device, dtype=dtype)

    cat = np.concatenate
    return _Plan(columns=on(columns, torch.float64),
                 row_sign=on(cat(signs) if signs else np.zeros(0), torch.float64),
                 rotation=on(cat(rotations) if rotations else np.zeros((0, sketch.K)), torch.int64),
                 row_tensor=on(cat(owners) if owners else np.zeros(0), torch.int64),
                 chunks=chunks, tensors=len(numels))


def _numels(tensors: Sequence[torch.Tensor]) -> list[int]:
    """Elements as the sketch reads them: a complex tensor's real and imaginary parts are two."""
    return [t.numel() * (2 if t.is_complex() else 1) for t in tensors]


def _flat(t: torch.Tensor) -> torch.Tensor:
    t = t.detach()
    if t.is_complex():
        t = torch.view_as_real(t)
    return t.reshape(-1)


@torch.no_grad()
def compute(plan: _Plan, tensors: Sequence[torch.Tensor], device: torch.device) -> torch.Tensor:
    """[tensors, 3 + K] float64 on `device`: sum, L2 norm, max |x|, then the K-bucket sketch."""
    flats = [_flat(t) for t in tensors]
    rows = plan.row_tensor.numel()
    if not rows:
        return torch.zeros((plan.tensors, sketch.STATS + sketch.K), dtype=torch.float64, device=device)
    scratch = torch.empty((max(n for n, _ in plan.chunks), sketch.COLUMNS), dtype=torch.float64, device=device)
    sums, squares, peaks = [], [], []
    C = sketch.COLUMNS  # noqa: N806
    for n, pieces in plan.chunks:
        part = scratch[:n]
        flat = part.view(-1)
        # Only the padding of a tensor's last row needs zeros: the data overwrite the rest of the scratch.
        tails = [flat[r * C + hi - lo : (r + -(-(hi - lo) // C)) * C] for _, lo, hi, r in pieces if (hi - lo) % C]
        if tails:
            torch._foreach_zero_(tails)
        torch._foreach_copy_([flat[r * C : r * C + hi - lo] for t, lo, hi, r in pieces],
                             [flats[t][lo:hi] for t, lo, hi, _ in pieces])
        sums.append(part @ plan.columns)  # [n, K + 1]
        squares.append(torch.linalg.vector_norm(part, 2, dim=1).square())
        # max |x| as the larger of max and -min: the same values, where vector_norm(inf) took 5x as long on a CPU
        peaks.append(torch.maximum(part.amax(dim=1), part.amin(dim=1).neg_()))
    per_row = torch.cat(sums)
    buckets = (per_row[:, : sketch.K] * plan.row_sign[:, None]).gather(1, plan.rotation)
    out = torch.zeros((plan.tensors, sketch.STATS + sketch.K), dtype=torch.float64, device=device)
    out[:, 0].index_add_(0, plan.row_tensor, per_row[:, sketch.K])
    out[:, 1].index_add_(0, plan.row_tensor, torch.cat(squares))
    out[:, 1].sqrt_()
    out[:, 2].scatter_reduce_(0, plan.row_tensor, torch.cat(peaks), reduce="amax")
    out[:, sketch.STATS :].index_add_(0, plan.row_tensor, buckets)
    return out


@functools.cache
def _triton() -> ModuleType | None:
    try:
        from detlab.tensors import drift_triton
    except ImportError:  # no Triton (a CPU build of torch): the torch pass
        return None
    return drift_triton


class Sketcher:
    """Queues the stats and sketches of tensor lists; keeps the plan of each list's layout between calls."""

    def __init__(self) -> None:
        self._plans: dict[tuple[Any, ...], Any] = {}  # a layout's _Plan, or its row maps for the CPU kernel

    def _kept(self, key: tuple[Any, ...], make: Callable[[], Any]) -> Any:
        plan = self._plans.get(key)
        if plan is None:
            if len(self._plans) >= KEPT_LAYOUTS:
                self._plans.pop(next(iter(self._plans)))
            plan = self._plans[key] = make()
        return plan

    def _compute(self, group: list[torch.Tensor], idx: list[int], device: torch.device) -> torch.Tensor:
        # Each tensor keeps its index in the whole list: the row map depends on it, not on the device.
        numels = _numels(group)
        plan = self._kept((str(device), tuple(numels), tuple(idx)), lambda: _plan(numels, idx, device))
        return compute(plan, group, device)

    def _on_cpu(self, group: list[torch.Tensor], idx: list[int]) -> Callable[[], np.ndarray | torch.Tensor]:
        """The CPU pass, to be run: the compiled kernel on the calling thread alone where numba is installed (and
        DETLAB_FP_NUMBA is not 0), else torch's."""
        numels, cpu = _numels(group), torch.device("cpu")
        if not drift_numba.available() or os.environ.get("DETLAB_FP_NUMBA") == "0":
            plan = self._kept((str(cpu), tuple(numels), tuple(idx)), lambda: _plan(numels, idx, cpu))
            return functools.partial(compute, plan, group, cpu)
        maps = self._kept(("numba", tuple(numels), tuple(idx)), lambda: drift_numba.row_maps(numels, idx))
        return functools.partial(drift_numba.values, maps, group)

    def _on_cuda(self, group: list[torch.Tensor], idx: list[int], device: torch.device) -> torch.Tensor:
        """The Triton kernel where it reads every tensor in place (one read of each element), else the torch pass."""
        kernel = _triton()
        if kernel is not None and all(kernel.supported(t) for t in group):
            return kernel.compute(group, idx, device)
        return self._compute(group, idx, device)

    def submit(self, tensors: Sequence[torch.Tensor], *,
               defer_cpu: bool = False) -> Callable[[], tuple[bytes, bytes] | None]:
        """Queue the work for `tensors` (read as they are now). The returned function gives (stats, sketch)
        packed as detlab.core.sketch packs them, or None where a value is not finite (a model that blew up:
        its digests are still recorded) or the list is longer than sketch.MAX_TENSORS. With `defer_cpu` the
        CPU tensors' pass runs when the function is called (on the recorder's writer thread): the caller
        hands over tensors nothing changes (a snapshot)."""
        if len(tensors) > sketch.MAX_TENSORS:
            return lambda: None
        by_device: dict[torch.device, list[int]] = {}
        for i, t in enumerate(tensors):
            by_device.setdefault(t.device, []).append(i)
        parts: list[tuple[list[int], Any, torch.cuda.Event | None]] = []
        for device, idx in by_device.items():
            group = [tensors[i].detach() for i in idx]
            if device.type == "cuda":
                with torch.cuda.device(device):
                    values = self._on_cuda(group, idx, device)
                    host = torch.empty(values.shape, dtype=torch.float64, pin_memory=True)
                    host.copy_(values, non_blocking=True)
                    done = recorded_event()
                parts.append((idx, host, done))
            elif device.type == "cpu":  # the pass now, or with `defer_cpu` on the reader's thread
                run = self._on_cpu(group, idx)
                parts.append((idx, run if defer_cpu else run(), None))
            else:
                parts.append((idx, self._compute(group, idx, device), None))

        def read() -> tuple[bytes, bytes] | None:
            out = np.zeros((len(tensors), sketch.STATS + sketch.K))
            for idx, values, done in parts:
                if done is not None:
                    done.synchronize()
                out[idx] = np.asarray(values() if callable(values) else values)
            if not np.isfinite(out).all():
                return None
            return sketch.pack(out[:, : sketch.STATS]), sketch.pack(out[:, sketch.STATS :])

        return read

