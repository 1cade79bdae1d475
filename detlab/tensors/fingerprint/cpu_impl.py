"""Fingerprints of CPU tensors with a compiled kernel on every core (numba), when numba is installed.

The algorithm is docs/fingerprint.md's, term for term: each word's two lane terms are computed in one loop in
unsigned 64-bit arithmetic (LLVM vectorises it: on AVX-512 the multiplies are `vpmullq`), the words cut into
pieces that a thread per core hashes (the compiled loop releases the GIL); pieces' lane sums are added mod
2^64, which does not depend on the order, so the digest does not depend on the thread count. Every key's
constants are arguments, so one compiled function serves fp2, fp1 and keyed digests. Compiled on first use and
cached on disk (`cache=True`), so a process pays the compile once per machine and version of numba.

Why numba: it ships wheels for Linux, macOS and Windows on x86-64 and ARM for every Python detlab supports, so
`pip install numba` works wherever a user's pip installs torch, with no compiler on their machine; a C extension
of our own would need wheels built per platform and Python. Without numba, `available()` is False and the torch
path runs (same digests, slower).
"""

from __future__ import annotations

import functools
import os
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

import numpy as np

from .reference import DEFAULT_KEY, MASK64, WORD_BYTES, DigestKey, finalize

if TYPE_CHECKING:
    import torch

# Words per thread's piece: 1M words (8 MiB) give a 64 MiB tensor 8 pieces to spread over the cores.
PIECE_WORDS = 1 << 20


@functools.cache
def _kernel() -> Any:
    """The compiled lane-sum function, or None without numba (compiled lazily: importing stays cheap)."""
    try:
        import numba
    except ImportError:
        return None

    # One plain loop, no prange: LLVM vectorises it (a prange body measured 10x slower, not vectorised); the
    # pieces go to threads instead (nogil), see `_pool`.
    @numba.njit(nogil=True, cache=True)
    def lane_sums(words, first, consts):  # type: ignore[no-untyped-def]  # pragma: no cover - compiled
        # consts: pos_mul0, pos_mul1, pos_add0, pos_add1, then lane 0's and lane 1's mixers (s1, m1, s2, m2, s3)
        g0, g1, a0, a1 = consts[0], consts[1], consts[2], consts[3]
        p1, q1, p2, q2, p3 = consts[4], consts[5], consts[6], consts[7], consts[8]
        r1, w1, r2, w2, r3 = consts[9], consts[10], consts[11], consts[12], consts[13]
        s0 = np.uint64(0)
        s1 = np.uint64(0)
        for j in range(words.shape[0]):
            pos = first + np.uint64(j)
            u = words[j]
            z = u ^ (pos * g0 + a0)
            z ^= z >> p1
            z *= q1
            z ^= z >> p2
            z *= q2
            z ^= z >> p3
            s0 += z
            y = u ^ (pos * g1 + a1)
            y ^= y >> r1
            y *= w1
            y ^= y >> r2
            y *= w2
            y ^= y >> r3
            s1 += y
        return s0, s1

    return lane_sums


@functools.cache
def _pool() -> ThreadPoolExecutor:
    # The kernel releases the GIL: one thread per core hashes one piece at a time.
    return ThreadPoolExecutor(max_workers=os.cpu_count() or 1, thread_name_prefix="detlab-fp")


def available() -> bool:
    """Whether the compiled kernel can run (numba is installed)."""
    return _kernel() is not None


@functools.cache
def _consts(key: DigestKey) -> np.ndarray:
    m0, m1 = key.mixers
    return np.array([*key.pos_mul, *key.pos_add, *m0, *m1], dtype=np.uint64)


def lane_sums_words(words: np.ndarray, first_pos: int, key: DigestKey = DEFAULT_KEY) -> tuple[int, int]:
    """Lane sums mod 2^64 of `words` (aligned, contiguous uint64), the first at word `first_pos`: pieces on
    every core, their sums added mod 2^64 (order-independent, so the thread count changes nothing)."""
    kernel, consts = _kernel(), _consts(key)
    n = words.shape[0]
    if n <= PIECE_WORDS:
        s0, s1 = kernel(words, np.uint64(first_pos & MASK64), consts)
        return int(s0), int(s1)
    parts = [_pool().submit(kernel, words[i : i + PIECE_WORDS], np.uint64((first_pos + i) & MASK64), consts)
             for i in range(0, n, PIECE_WORDS)]
    s0 = s1 = 0
    for part in parts:
        a, b = part.result()
        s0, s1 = (s0 + int(a)) & MASK64, (s1 + int(b)) & MASK64
    return s0, s1


def fingerprint_array(data: np.ndarray, key: DigestKey = DEFAULT_KEY) -> str:
    """Digest of a contiguous uint8 array's bytes (`available()` must be true)."""
    nbytes = data.nbytes
    nfull = nbytes // WORD_BYTES
    body = data[: nfull * WORD_BYTES]
    if body.ctypes.data % WORD_BYTES:  # a view that starts mid-word (t[1:] of uint8): numba wants aligned words
        body = body.copy()
    s0, s1 = lane_sums_words(body.view(np.uint64), 0, key) if nfull else (0, 0)
    if rest := nbytes - nfull * WORD_BYTES:
        tail = np.zeros(WORD_BYTES, dtype=np.uint8)
        tail[:rest] = data[nfull * WORD_BYTES :]
        a, b = lane_sums_words(tail.view(np.uint64), nfull, key)
        s0, s1 = (s0 + a) & MASK64, (s1 + b) & MASK64
    return finalize(s0, s1, nbytes, key)


def fingerprint_cpu(tensor: torch.Tensor, key: DigestKey = DEFAULT_KEY) -> str:
    """Digest of a CPU tensor's logical bytes under `key` with the compiled kernel (`available()` must be true)."""
    from .torch_impl import byte_view

    return fingerprint_array(byte_view(tensor).numpy(), key)
