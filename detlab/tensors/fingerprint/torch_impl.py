"""Fingerprints of every version, keyed too, in plain torch ops: one path for CPU, CUDA and ROCm, no Triton.

torch has no unsigned 64-bit arithmetic on every backend, so words live in int64: addition and
multiplication wrap mod 2^64 (two's complement), which is all the algorithm needs, and right shifts are
arithmetic, so each one is masked to make it logical.
"""

from __future__ import annotations

import torch

from . import UnsupportedTensorError
from .reference import DEFAULT_KEY, MASK64, WORD_BYTES, DigestKey, Mixer, finalize

# Words per chunk. On CPU a small chunk keeps the ~3 int64 temporaries per lane inside L2; on GPUs a
# large one amortises launch overhead while bounding the extra memory to ~1 GiB.
CPU_CHUNK_WORDS = 1 << 18
GPU_CHUNK_WORDS = 1 << 24
# Element size -> an integer dtype of that size (complex128's 16 bytes have none: it is copied as itself).
_SAME_SIZE_INT = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def _signed(c: int) -> int:
    """The int64 with the same bits as the 64-bit unsigned constant c."""
    c &= MASK64
    return c - (1 << 64) if c >= 1 << 63 else c


def _describe(tensor: torch.Tensor) -> str:
    return f"{type(tensor).__name__} of dtype {str(tensor.dtype).removeprefix('torch.')}, shape {tuple(tensor.shape)}"


def check_supported(tensor: torch.Tensor) -> None:
    """Raise UnsupportedTensorError unless the tensor is a plain strided tensor whose bytes are its values.

    Order matters: a jagged nested tensor is also a dispatch subclass, and is_quantized or layout of a
    subclass would go through its __torch_dispatch__.
    """
    if tensor.is_nested:
        raise UnsupportedTensorError(
            f"cannot fingerprint a nested tensor (dtype {str(tensor.dtype).removeprefix('torch.')}, layout "
            f"{tensor.layout}; no single shape): its components "
            "are separate buffers; fingerprint each of t.unbind()"
        )
    if type(tensor).__torch_dispatch__ is not torch.Tensor.__torch_dispatch__:
        raise UnsupportedTensorError(
            f"cannot fingerprint a {type(tensor).__name__}: the subclass overrides __torch_dispatch__, so its "
            "bytes are not those of one plain tensor; fingerprint the plain tensors it holds (e.g. "
            "DTensor.to_local())"
        )
    if tensor.is_meta:
        raise UnsupportedTensorError(f"cannot fingerprint a meta tensor ({_describe(tensor)}): it has no data")
    if tensor.is_quantized:
        raise UnsupportedTensorError(
            f"cannot fingerprint a quantized tensor ({_describe(tensor)}): its bytes do not include its scale "
            "and zero point; fingerprint t.int_repr() and record t.qscheme() with t.q_scale()/t.q_zero_point() "
            "(per channel: t.q_per_channel_scales(), ...), or fingerprint t.dequantize()"
        )
    if tensor.layout != torch.strided:
        raise UnsupportedTensorError(
            f"cannot fingerprint a {tensor.layout} tensor ({_describe(tensor)}): fingerprints cover dense "
            "tensors; call .to_dense() first"
        )


def byte_view(tensor: torch.Tensor) -> torch.Tensor:
    """Flat uint8 tensor of `tensor`'s bytes in logical row-major order; copies only if it must."""
    check_supported(tensor)
    # conj/neg views are lazy flags on the same storage: materialise them so we hash the logical values.
    dense = tensor.detach().resolve_conj().resolve_neg()
    if not dense.is_contiguous():
        # Copy as integers of the element's size: bit for bit for every dtype, where a copy in the dtype itself
        # may rewrite bytes (a bool byte other than 0 or 1) or not exist (sub-byte and quantized dtypes).
        same_size = _SAME_SIZE_INT.get(dense.element_size())
        dense = (dense if same_size is None else dense.view(same_size)).contiguous()
    # Contiguous means the elements lie row-major one after the other from the storage offset. It does not
    # mean stride 1: a dimension of size 1 may have any stride (t[::2] of 2 elements, an expand to size 1),
    # and view(uint8) needs stride 1, so say it outright.
    flat = dense.as_strided((dense.numel(),), (1,))
    return flat if flat.dtype == torch.uint8 else flat.view(torch.uint8)


def _logical_shift_right(z: torch.Tensor, s: int) -> torch.Tensor:
    return torch.bitwise_and(z >> s, (1 << (64 - s)) - 1)


def _mix_(z: torch.Tensor, params: Mixer) -> torch.Tensor:
    s1, m1, s2, m2, s3 = params
    z ^= _logical_shift_right(z, s1)
    z *= _signed(m1)
    z ^= _logical_shift_right(z, s2)
    z *= _signed(m2)
    z ^= _logical_shift_right(z, s3)
    return z


def lane_sums_words(words: torch.Tensor, first_pos: int, key: DigestKey = DEFAULT_KEY) -> torch.Tensor:
    """int64[2] lane sums of `words` (an int64 tensor of little-endian words) starting at word first_pos."""
    pos = torch.arange(words.numel(), dtype=torch.int64, device=words.device)
    pos += _signed(first_pos)
    sums = []
    for lane, params in enumerate(key.mixers):
        offset = pos * _signed(key.pos_mul[lane])
        if key.pos_add[lane]:
            offset += _signed(key.pos_add[lane])
        offset ^= words
        sums.append(_mix_(offset, params).sum())
    return torch.stack(sums)


def lane_sums(
    tensor: torch.Tensor, chunk_words: int | None = None, key: DigestKey = DEFAULT_KEY
) -> tuple[int, int, int]:
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
        acc += lane_sums_words(words, start, key)
    rest = nbytes - nfull * WORD_BYTES
    if rest:
        tail = torch.zeros(WORD_BYTES, dtype=torch.uint8, device=u8.device)
        tail[:rest] = u8[nfull * WORD_BYTES :]
        acc += lane_sums_words(tail.view(torch.int64), nfull, key)
    s0, s1 = (int(v) & MASK64 for v in acc.tolist())
    return s0, s1, nbytes


def fingerprint_torch(tensor: torch.Tensor, chunk_words: int | None = None, key: DigestKey = DEFAULT_KEY) -> str:
    """Digest under `key` (fp2 by default) computed with plain torch ops on the tensor's own device."""
    with torch.no_grad():
        s0, s1, nbytes = lane_sums(tensor, chunk_words, key)
    return finalize(s0, s1, nbytes, key)
