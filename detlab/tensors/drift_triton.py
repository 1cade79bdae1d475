"""The stats and count sketch (detlab.core.sketch, `cs1`) of CUDA tensors in one Triton launch per dtype.

detlab/tensors/drift.py's torch pass copies every element into a float64 scratch matrix and reads it three times (about
36 bytes of traffic per float32 element); this kernel reads each element once where it lies. One program takes
one row of COLUMNS elements of one tensor, gathered bucket by bucket (the row stays in cache, so each element
is read from memory once), converts it to float64 and writes the row's K signed bucket sums
(already rotated by the row's bucket, so they add up per tensor), its sum, sum of squares and max |x|. The
rows are then added per tensor as the torch pass adds them. Same map, same float64 accumulation: the results
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

DTYPES = {torch.float32: tl.float32, torch.bfloat16: tl.bfloat16, torch.float16: tl.float16, torch.float64: tl.float64}
ROW_VALUES = sketch.K + 3  # K buckets, sum, sum of squares, max |x|
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
    """One launch: the rows of a dtype's tensors (address, valid elements, row bucket and sign, owner)."""

    elem: Any
    table: list[torch.Tensor]


_plans: dict[tuple[Any, ...], list[_Group]] = {}
KEPT_PLANS = 8


def _plan(tensors: Sequence[torch.Tensor], indices: Sequence[int], device: torch.device) -> list[_Group]:
    # Kept per list of (pointer, size, dtype): parameters keep their storage from step to step, and the row maps
    # cost host time (a numpy hash per row) that a training loop should pay once.
    key = (str(device), *((t.data_ptr(), t.numel(), t.dtype, i) for t, i in zip(tensors, indices, strict=True)))
    if key in _plans:
        return _plans[key]
    groups = []
    for dtype in dict.fromkeys(t.dtype for t in tensors):
        parts: list[list[np.ndarray]] = [[], [], [], [], []]
        for i, t in enumerate(tensors):
            if t.dtype != dtype or not t.numel():
                continue
            n, rows = t.numel(), sketch.rows_of(t.numel())
            first = np.arange(rows, dtype=np.int64) * sketch.COLUMNS
            b2, s2 = sketch.row_map(indices[i], rows)
            addrs, counts = t.data_ptr() + first * t.element_size(), np.minimum(n - first, sketch.COLUMNS)
            columns: tuple[np.ndarray, ...] = (addrs, counts, b2.astype(np.int32), s2, np.full(rows, i, dtype=np.int64))
            for part, values in zip(parts, columns, strict=True):
                part.append(values)
        if parts[0]:
            groups.append(_Group(DTYPES[dtype], [torch.from_numpy(np.concatenate(p)).to(device) for p in parts]))
    if len(_plans) >= KEPT_PLANS:
        _plans.pop(next(iter(_plans)))
    _plans[key] = groups
    return groups


def compute(tensors: Sequence[torch.Tensor], indices: Sequence[int], device: torch.device) -> torch.Tensor:
    """[tensors, 3 + K] float64 on `device` (sum, L2 norm, max |x|, then the sketch), as drift.compute gives it;
    `indices`: each tensor's index in the recorded list. Every tensor must be `supported`."""
    out = torch.zeros((len(tensors), sketch.STATS + sketch.K), dtype=torch.float64, device=device)
    columns = _column_map(device)
    for group in _plan(tensors, indices, device):
        addr, count, bucket, sign, owner = group.table
        per_row = torch.empty((addr.numel(), ROW_VALUES), dtype=torch.float64, device=device)
        _rows_kernel[(addr.numel(),)](addr, count, bucket, sign, *columns, per_row, ELEM=group.elem, K=sketch.K,
                                      SLOTS=SLOTS, num_warps=NUM_WARPS)
        out[:, 0].index_add_(0, owner, per_row[:, sketch.K])
        out[:, 1].index_add_(0, owner, per_row[:, sketch.K + 1])
        out[:, 2].scatter_reduce_(0, owner, per_row[:, sketch.K + 2], reduce="amax")
        out[:, sketch.STATS:].index_add_(0, owner, per_row[:, : sketch.K])
    out[:, 1].sqrt_()
    return out
