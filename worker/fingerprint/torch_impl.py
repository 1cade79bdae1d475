"""fp1 in plain torch ops: one code path for CPU, CUDA and ROCm, no Triton.

torch has no unsigned 64-bit arithmetic on every backend, so words live in int64: addition and
multiplication wrap mod 2^64 (two's complement), which is all the algorithm needs, and right shifts are
arithmetic, so each one is masked to make it logical.
"""

from __future__ import annotations

import torch

from .reference import MASK64, MIX0, MIX1, POS_MUL, WORD_BYTES, finalize

# Words per chunk. On CPU a small chunk keeps the ~3 int64 temporaries per lane inside L2; on GPUs a
# large one amortises launch overhead while bounding the extra memory to ~1 GiB.
CPU_CHUNK_WORDS = 1 << 18
GPU_CHUNK_WORDS = 1 << 24


def _signed(c: int) -> int:
    """The int64 with the same bits as the 64-bit unsigned constant c."""
    c &= MASK64
    return c - (1 << 64) if c >= 1 << 63 else c


def byte_view(tensor: torch.Tensor) -> torch.Tensor:
    """Flat uint8 tensor of `tensor`'s bytes in logical row-major order; copies only if it must."""
    if tensor.layout != torch.strided:
        raise TypeError(f"fingerprints cover dense tensors; got layout {tensor.layout}, call .to_dense() first")
    # conj/neg views are lazy flags on the same storage: materialise them so we hash the logical values.
    flat = tensor.detach().resolve_conj().resolve_neg().contiguous().reshape(-1)
    return flat if flat.dtype == torch.uint8 else flat.view(torch.uint8)


def _logical_shift_right(z: torch.Tensor, s: int) -> torch.Tensor:
    return torch.bitwise_and(z >> s, (1 << (64 - s)) - 1)


def _mix_(z: torch.Tensor, params: tuple[int, int, int, int, int]) -> torch.Tensor:
    s1, m1, s2, m2, s3 = params
    z ^= _logical_shift_right(z, s1)
    z *= _signed(m1)
    z ^= _logical_shift_right(z, s2)
    z *= _signed(m2)
    z ^= _logical_shift_right(z, s3)
    return z


def lane_sums_words(words: torch.Tensor, first_pos: int) -> torch.Tensor:
    """int64[2] lane sums of `words` (an int64 tensor of little-endian words) starting at word first_pos."""
    pos = torch.arange(words.numel(), dtype=torch.int64, device=words.device)
    pos += _signed(first_pos)
    sums = []
    for lane, params in enumerate((MIX0, MIX1)):
        key = pos * _signed(POS_MUL[lane])
        key ^= words
        sums.append(_mix_(key, params).sum())
    return torch.stack(sums)


def lane_sums(tensor: torch.Tensor, chunk_words: int | None = None) -> tuple[int, int, int]:
    """(lane sum 0, lane sum 1, byte length) of a tensor's logical bytes."""
    u8 = byte_view(tensor)
    nbytes = u8.numel()
    if chunk_words is None:
        chunk_words = CPU_CHUNK_WORDS if u8.device.type == "cpu" else GPU_CHUNK_WORDS
    nfull = nbytes // WORD_BYTES
    acc = torch.zeros(2, dtype=torch.int64, device=u8.device)
    # A view starting mid-word (e.g. t[1:] of a uint8 tensor) cannot be reinterpreted as int64 in place;
    # such chunks are copied, which keeps the extra memory bounded by the chunk size.
    aligned = u8.storage_offset() % WORD_BYTES == 0
    for start in range(0, nfull, chunk_words):
        stop = min(start + chunk_words, nfull)
        chunk = u8[start * WORD_BYTES : stop * WORD_BYTES]
        words = (chunk if aligned else chunk.clone()).view(torch.int64)
        acc += lane_sums_words(words, start)
    rest = nbytes - nfull * WORD_BYTES
    if rest:
        tail = torch.zeros(WORD_BYTES, dtype=torch.uint8, device=u8.device)
        tail[:rest] = u8[nfull * WORD_BYTES :]
        acc += lane_sums_words(tail.view(torch.int64), nfull)
    s0, s1 = (int(v) & MASK64 for v in acc.tolist())
    return s0, s1, nbytes


def fingerprint_torch(tensor: torch.Tensor, chunk_words: int | None = None) -> str:
    """fp1 digest computed with plain torch ops on the tensor's own device."""
    with torch.no_grad():
        s0, s1, nbytes = lane_sums(tensor, chunk_words)
    return finalize(s0, s1, nbytes)
