"""Stats and count sketches (detlab.core.sketch, `cs1`) of CPU tensors with a compiled kernel (numba), on the
calling thread alone.

The recorder sketches a CPU model on its writer thread while the training loop goes on. torch's pass
(detlab.tensors.drift) would start intra-op threads of its own there, as many as the loop uses, and the two sets
would share the cores the loop keeps busy (bench/sdk_overhead.py, PyTorch's MNIST example on 2 cores). This
kernel runs on the thread that calls it and reads each element once, in one compiled loop: for each column
c of the tensor's matrix view (sketch.COLUMNS wide), float64 sums over the rows of one row bucket b2 (signed by
their s2), and the column's sum, sum of squares and max |x|; then each row bucket's column sums go to their
buckets (b1(c) + b2) mod K, signed by s1(c). The same values as the torch pass, added in another order (the tests
hold both to the references at 1e-12). Any dtype: float32 and float64 are read in place, others converted by
numpy first. Without numba, `available()` is False and the torch pass runs.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
import torch

from detlab.core import sketch


@functools.cache
def _kernel() -> Any:
    """The compiled per-tensor function, or None without numba (compiled on first use, cached on disk)."""
    try:
        import numba
    except ImportError:
        return None

    @numba.njit(nogil=True, cache=True)
    def tensor_values(x, row_bucket, row_sign, col_bucket, col_sign, acc, per_col, used, out):  # type: ignore[no-untyped-def]  # pragma: no cover - compiled
        # x: the flat float32 or float64 elements; acc: float64[K, C] scratch; per_col: float64[3, C] scratch;
        # used: bool[K]; out: float64[3 + K], written whole.
        C = col_bucket.shape[0]  # noqa: N806
        K = acc.shape[0]  # noqa: N806
        n = x.shape[0]
        width = min(n, C)
        total, squares, peak = per_col[0], per_col[1], per_col[2]
        total[:width] = 0.0
        squares[:width] = 0.0
        peak[:width] = 0.0
        used[:] = False
        for r in range((n + C - 1) // C):
            g = row_bucket[r]
            if not used[g]:
                acc[g, :width] = 0.0
                used[g] = True
            s = row_sign[r]
            base = r * C
            m = min(C, n - base)
            # The row and its columns' sums as slices indexed from 0 to m: no index can be negative, so numba
            # drops its wrap-around branch from every access (3.12 to 3.61 GB/s: results/2026-12-03-cpu-sketch-slices).
            # Three loops over the row (it stays in L1): the one loop that wrote all four arrays compiled to scalar
            # adds; the first two of these compile to packed ones (results/2026-12-04-cpu-sketch-loops).
            row = x[base : base + m]
            a = acc[g, :m]
            for c in range(m):
                a[c] += s * np.float64(row[c])
            sums = total[:m]
            sq = squares[:m]
            for c in range(m):
                v = np.float64(row[c])
                sums[c] += v
                sq[c] += v * v
            pk = peak[:m]
            for c in range(m):
                v = abs(np.float64(row[c]))
                if v > pk[c]:
                    pk[c] = v
        t = 0.0
        q = 0.0
        p = 0.0
        for c in range(width):
            t += total[c]
            q += squares[c]
            if peak[c] > p:
                p = peak[c]
        out[:] = 0.0
        out[0] = t  # a NaN or inf among the elements reaches the sum: the caller sees a value that is not finite
        out[1] = np.sqrt(q)
        out[2] = p
        for g in range(K):
            if used[g]:
                a = acc[g]
                for c in range(width):
                    out[3 + (col_bucket[c] + g) % K] += col_sign[c] * a[c]

    return tensor_values


def available() -> bool:
    """Whether the compiled kernel can run (numba is installed)."""
    return _kernel() is not None


@functools.cache
def _column_map() -> tuple[np.ndarray, np.ndarray]:
    return sketch.column_map()


def row_maps(numels: Sequence[int], indices: Sequence[int]) -> list[tuple[np.ndarray, np.ndarray]]:
    """Each tensor's row map (bucket, sign), from its element count and its index in the recorded list."""
    return [sketch.row_map(i, sketch.rows_of(n)) for n, i in zip(numels, indices, strict=True)]


def _elements(t: torch.Tensor) -> np.ndarray:
    """A CPU tensor's elements, flat, as a float32 or float64 array (read in place where they already are)."""
    t = t.detach()
    if t.is_complex():
        t = torch.view_as_real(t)
    t = t.reshape(-1)
    if t.dtype == torch.bfloat16:  # numpy has no bfloat16: its bits are a float32's upper half
        return (t.view(torch.int16).numpy().astype(np.uint32) << 16).view(np.float32)
    x = t.numpy()
    return x if x.dtype in (np.float32, np.float64) else x.astype(np.float64)


def _values(maps: Sequence[tuple[np.ndarray, np.ndarray]], arrays: Iterable[np.ndarray]) -> np.ndarray:
    kernel = _kernel()
    b1, s1 = _column_map()
    acc = np.empty((sketch.K, sketch.COLUMNS))
    per_col = np.empty((3, sketch.COLUMNS))
    used = np.empty(sketch.K, dtype=np.bool_)
    out = np.empty((len(maps), sketch.STATS + sketch.K))
    for i, x in enumerate(arrays):
        b2, s2 = maps[i]
        kernel(x, b2, s2, b1, s1, acc, per_col, used, out[i])
    return out


def values(maps: Sequence[tuple[np.ndarray, np.ndarray]], tensors: Sequence[torch.Tensor]) -> np.ndarray:
    """[tensors, 3 + K] float64: sum, L2 norm, max |x|, then the K-bucket sketch (`available()` must be true);
    `maps`: row_maps of these tensors. Each tensor is converted (where it must be) only when its turn comes."""
    return _values(maps, map(_elements, tensors))


def warm() -> None:
    """Compile the kernel for float32 and float64, or load it from numba's disk cache, without a torch op: a
    zygote does it once for every rank it forks (worker/zygote.py)."""
    maps = row_maps([1], [0]) * 2
    _values(maps, [np.zeros(1, dtype=np.float32), np.zeros(1, dtype=np.float64)])
