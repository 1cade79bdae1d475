"""The stats and count sketch (detlab.core.sketch, `cs1`) of CUDA tensors in one Triton launch per dtype.

detlab/tensors/drift.py's torch pass copies every element into a float64 scratch matrix and reads it three times (about
36 bytes of traffic per float32 element); this kernel reads each element once where it lies. One program takes
one row of COLUMNS elements of one tensor, gathered bucket by bucket (the row stays in cache, so each element
is read from memory once), converts it to float64 and writes the row's K signed bucket sums
(already rotated by the row's bucket, so they add up per tensor), its sum, sum of squares and max |x|. The
rows are then added per tensor in a fixed order (onepass_triton.add_per_tensor: the same bits on every run, where
float64 atomics would add in whatever order the programs finish). Same map, float64 accumulation: the results
equal the torch pass's and the numpy reference's up to float64 rounding (tests/tensors/test_drift.py).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import triton
import triton.language as tl

from detlab.core import sketch
from detlab.tensors import onepass_triton

DTYPES = {torch.float32: tl.float32, torch.bfloat16: tl.bfloat16, torch.float16: tl.float16, torch.float64: tl.float64}
SLOTS = 512  # columns per bucket in the gather table: cs1's buckets hold 230 to 295 of the 4096 columns
NUM_WARPS = 4  # of 4, 8 and 16, the fastest on an H200 (1.29, 1.79 and 1.92 ms on GPT-2-small's 0.5 GB)


@triton.jit
def _rows_kernel(row_addr, row_n, row_bucket, row_sign, col_index, col_sign, out,
                 ELEM: tl.constexpr, K: tl.constexpr, SLOTS: tl.constexpr):
    r = tl.program_id(0)
    base = tl.load(row_addr + r).to(tl.pointer_type(ELEM))
    slot = tl.arange(0, K)[:, None] * SLOTS + tl.arange(0, SLOTS)[None, :]
    col = tl.load(col_index + slot)  # [K, SLOTS]: row j lists the columns of bucket j, then -1
    x = tl.load(base + col, mask=(col >= 0) & (col < tl.load(row_n + r)), other=0).to(tl.float64)
    buckets = tl.sum(x * tl.load(col_sign + slot), axis=1)  # the K column-bucket sums of the row
    o = out + r * (K + 3)
    # The row's own bucket rotates its sums and its sign signs them: element bucket (b1 + b2) mod K, sign s1 * s2.
    tl.store(o + (tl.arange(0, K) + tl.load(row_bucket + r)) % K, buckets * tl.load(row_sign + r))
    tl.store(o + K, tl.sum(tl.sum(x, axis=1), axis=0))
    tl.store(o + K + 1, tl.sum(tl.sum(x * x, axis=1), axis=0))
    tl.store(o + K + 2, tl.max(tl.max(tl.abs(x), axis=1), axis=0))


def supported(t: torch.Tensor) -> bool:
    """Read in place by the kernel: a contiguous CUDA tensor of a floating dtype it loads."""
    return t.is_cuda and t.dtype in DTYPES and t.is_contiguous() and not t.is_conj() and not t.is_neg()


@functools.cache
def _column_map(device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """The columns of each bucket, as a [K, SLOTS] table padded with -1, and their signs (0 where padded): a
    program gathers its row bucket by bucket and sums each bucket once, rather than masking the row K times."""
    b1, s1 = sketch.column_map()
    index, sign = np.full((sketch.K, SLOTS), -1, dtype=np.int32), np.zeros((sketch.K, SLOTS))
    for j in range(sketch.K):
        (cols,) = np.nonzero(b1 == j)
        if cols.size > SLOTS:  # the map is fixed (cs1), so this is a programming error, never a runtime surprise
            raise AssertionError(f"bucket {j} holds {cols.size} columns, more than the table's {SLOTS}")
        index[j, : cols.size], sign[j, : cols.size] = cols, s1[cols]
    return torch.from_numpy(index).to(device), torch.from_numpy(sign).to(device)


@dataclass
class _Group:
    """One launch: the rows of a dtype's tensors (address, valid elements, row bucket and sign), written from
    row `first` of the plan's per-row values."""

    elem: Any
    table: list[torch.Tensor]
    first: int


@dataclass
class _Plan:
    groups: list[_Group]
    rows: int
    lo: torch.Tensor  # int64[n]: tensor i's rows of per-row values are [lo[i], hi[i])
    hi: torch.Tensor


_plans: dict[tuple[Any, ...], _Plan] = {}
KEPT_PLANS = 8


def _plan(tensors: Sequence[torch.Tensor], indices: Sequence[int], device: torch.device) -> _Plan:
    # Kept per list of (pointer, size, dtype): parameters keep their storage from step to step, and the row maps
    # cost host time (a numpy hash per row) that a training loop should pay once.
    key = (str(device), *((t.data_ptr(), t.numel(), t.dtype, i) for t, i in zip(tensors, indices, strict=True)))
    if key in _plans:
        return _plans[key]
    groups = []
    lo, hi = np.zeros(len(tensors), dtype=np.int64), np.zeros(len(tensors), dtype=np.int64)
    at = 0
    for dtype in dict.fromkeys(t.dtype for t in tensors):
        parts: list[list[np.ndarray]] = [[], [], [], []]
        first = at
        for i, t in enumerate(tensors):
            if t.dtype != dtype or not t.numel():
                continue
            n, rows = t.numel(), sketch.rows_of(t.numel())
            starts = np.arange(rows, dtype=np.int64) * sketch.COLUMNS
            b2, s2 = sketch.row_map(indices[i], rows)
            addrs, counts = t.data_ptr() + starts * t.element_size(), np.minimum(n - starts, sketch.COLUMNS)
            # Typed: mypy's join of these four arrays' types depends on the order it reads modules (object, once).
            columns: tuple[np.ndarray, ...] = (addrs, counts, b2.astype(np.int32), s2)
            for part, values in zip(parts, columns, strict=True):
                part.append(values)
            lo[i], hi[i] = at, at + rows
            at += rows
        if parts[0]:
            groups.append(_Group(DTYPES[dtype], [torch.from_numpy(np.concatenate(p)).to(device) for p in parts], first))
    plan = _Plan(groups, at, torch.from_numpy(lo).to(device), torch.from_numpy(hi).to(device))
    if len(_plans) >= KEPT_PLANS:
        _plans.pop(next(iter(_plans)))
    _plans[key] = plan
    return plan


def compute(tensors: Sequence[torch.Tensor], indices: Sequence[int], device: torch.device) -> torch.Tensor:
    """[tensors, 3 + K] float64 on `device` (sum, L2 norm, max |x|, then the sketch), as drift.compute gives it;
    `indices`: each tensor's index in the recorded list. Every tensor must be `supported`."""
    out = torch.zeros((len(tensors), sketch.STATS + sketch.K), dtype=torch.float64, device=device)
    plan = _plan(tensors, indices, device)
    if not plan.rows:
        return out
    columns = _column_map(device)
    per_row = torch.empty((plan.rows, onepass_triton.ROW_VALUES), dtype=torch.float64, device=device)
    for group in plan.groups:
        addr, count, bucket, sign = group.table
        _rows_kernel[(addr.numel(),)](addr, count, bucket, sign, *columns, per_row[group.first :], ELEM=group.elem,
                                      K=sketch.K, SLOTS=SLOTS, num_warps=NUM_WARPS)
    onepass_triton.add_per_tensor(per_row, plan.lo, plan.hi, out)
    return out
