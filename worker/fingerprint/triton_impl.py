"""fp1 as one Triton launch for a whole list of CUDA tensors.

Each tensor becomes one or two segments of little-endian 64-bit words: its body, read in place, and a
zero-padded tail word when its byte length is not a multiple of 8. A table of segment base pointers is
passed to the kernel; each program hashes one tile of one segment and writes its two partial lane sums.
Partials are added on the host in uint64: addition mod 2^64 is order-independent, so the digest does not
depend on the tiling or the schedule.

The mixing constants are literals in the kernel and must equal those in reference.py;
`check_against_reference` (run once per device before first use), the tests and `bench/fingerprint.py
--check` verify that they do.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import triton
import triton.language as tl

from .reference import MASK64, POS_MUL, WORD_BYTES, finalize_many, fingerprint_bytes
from .torch_impl import byte_view

# 1024 words per block, up to 32 blocks (256 KiB) per program: measured fastest on an H200.
BLOCK = 1024
ITERS = 32
NUM_WARPS = 8
# Segment bodies start 16-byte aligned (copied otherwise) so the kernel may use 128-bit loads.
ALIGN = 16


@triton.jit
def _mix0(z):
    # splitmix64 finalizer; z is uint64, so >> is a logical shift and * wraps mod 2^64.
    z = z ^ (z >> 30)
    z = z * 0xBF58476D1CE4E5B9
    z = z ^ (z >> 27)
    z = z * 0x94D049BB133111EB
    return z ^ (z >> 31)


@triton.jit
def _mix1(z):
    # MurmurHash3 fmix64.
    z = z ^ (z >> 33)
    z = z * 0xFF51AFD7ED558CCD
    z = z ^ (z >> 33)
    z = z * 0xC4CEB9FE1A85EC53
    return z ^ (z >> 33)


@triton.jit
def _fp1_partials_kernel(seg_ptr, seg_nwords, seg_pos, prog_seg, prog_first, out, BLOCK: tl.constexpr,
                         ITERS: tl.constexpr, STEP0: tl.constexpr, STEP1: tl.constexpr):  # fmt: skip
    pid = tl.program_id(0)
    seg = tl.load(prog_seg + pid)
    first = tl.multiple_of(tl.load(prog_first + pid), BLOCK)
    nwords = tl.load(seg_nwords + seg)
    base = tl.multiple_of(tl.load(seg_ptr + seg).to(tl.pointer_type(tl.int64)), 16)
    lanes = tl.arange(0, BLOCK)
    pos = (tl.load(seg_pos + seg) + first + lanes).to(tl.uint64, bitcast=True)
    # Position keys j * G are advanced by BLOCK * G per block instead of multiplied per word.
    key0 = pos * 0x9E3779B97F4A7C15
    key1 = pos * 0xD1B54A32D192ED03
    acc0 = tl.zeros([BLOCK], dtype=tl.uint64)
    acc1 = tl.zeros([BLOCK], dtype=tl.uint64)
    # Whole blocks need no masks (and allow 128-bit loads); a small tensor loops only as far as it goes.
    nfull = tl.minimum((nwords - first) // BLOCK, ITERS).to(tl.int32)
    for it in range(0, nfull):
        word = tl.load(base + (first + it * BLOCK + lanes)).to(tl.uint64, bitcast=True)
        acc0 += _mix0(word ^ key0)
        acc1 += _mix1(word ^ key1)
        key0 += STEP0
        key1 += STEP1
    if nfull < ITERS:
        idx = first + nfull * BLOCK + lanes
        mask = idx < nwords
        word = tl.load(base + idx, mask=mask, other=0).to(tl.uint64, bitcast=True)
        acc0 += tl.where(mask, _mix0(word ^ key0), 0)
        acc1 += tl.where(mask, _mix1(word ^ key1), 0)
    tl.store(out + 2 * pid, tl.sum(acc0, axis=0).to(tl.int64, bitcast=True))
    tl.store(out + 2 * pid + 1, tl.sum(acc1, axis=0).to(tl.int64, bitcast=True))


def _segments(tensor: torch.Tensor) -> tuple[list[tuple[torch.Tensor, int]], int]:
    """([(int64-word buffer, first word position)], byte length) for one tensor; views only if possible."""
    plain = tensor.layout == torch.strided and tensor.is_contiguous()
    src = tensor if plain and not tensor.is_conj() and not tensor.is_neg() else byte_view(tensor)
    nbytes = src.numel() * src.element_size()
    nfull = nbytes // WORD_BYTES
    segs: list[tuple[torch.Tensor, int]] = []
    if nfull:
        if src.data_ptr() % ALIGN:
            src = byte_view(src).clone()  # a view starting mid-word: aligned loads need a copy
        segs.append((src, 0))
    if nbytes % WORD_BYTES:
        u8 = byte_view(src)
        tail = torch.zeros(WORD_BYTES, dtype=torch.uint8, device=u8.device)
        tail[: nbytes - nfull * WORD_BYTES] = u8[nfull * WORD_BYTES :]
        segs.append((tail, nfull))
    return segs, nbytes


@dataclass
class Plan:
    """Everything one launch needs; `bufs` keeps copies and tail words alive until the kernel is done."""

    bufs: list[torch.Tensor]
    table: torch.Tensor  # [ptr, nwords, first position] per segment, then [segment, first word] per program
    programs: int
    programs_per_tensor: np.ndarray
    nbytes: np.ndarray


def plan(tensors: list[torch.Tensor]) -> Plan:
    """Split tensors into word segments and tiles and upload the tables (host side of a launch)."""
    bufs: list[torch.Tensor] = []
    ptrs, nwords, first_pos, owner, nbytes = [], [], [], [], []
    for i, t in enumerate(tensors):
        segs, n = _segments(t)
        nbytes.append(n)
        for buf, pos in segs:
            bufs.append(buf)
            ptrs.append(buf.data_ptr())
            nwords.append(buf.numel() * buf.element_size() // WORD_BYTES)
            first_pos.append(pos)
            owner.append(i)
    tile = BLOCK * ITERS
    nw = np.array(nwords, dtype=np.int64)
    nprog = (nw + tile - 1) // tile
    total = int(nprog.sum())
    prog_seg = np.repeat(np.arange(len(bufs), dtype=np.int64), nprog)
    prog_first = (np.arange(total, dtype=np.int64) - np.repeat(np.cumsum(nprog) - nprog, nprog)) * tile
    host = np.concatenate([np.array(ptrs, dtype=np.int64), nw, np.array(first_pos, dtype=np.int64),
                           prog_seg, prog_first])  # fmt: skip
    return Plan(
        bufs=bufs,
        table=torch.from_numpy(host).to(tensors[0].device),
        programs=total,
        programs_per_tensor=np.bincount(np.repeat(np.array(owner, dtype=np.int64), nprog), minlength=len(tensors)),
        nbytes=np.array(nbytes, dtype=np.uint64),
    )


def launch(p: Plan) -> torch.Tensor:
    """Run the kernel; returns the int64[programs, 2] partial lane sums (still on the GPU)."""
    out = torch.empty((p.programs, 2), dtype=torch.int64, device=p.table.device)
    if p.programs:
        nseg, t = len(p.bufs), p.table
        _fp1_partials_kernel[(p.programs,)](
            t[:nseg], t[nseg : 2 * nseg], t[2 * nseg : 3 * nseg], t[3 * nseg : 3 * nseg + p.programs],
            t[3 * nseg + p.programs :], out, BLOCK=BLOCK, ITERS=ITERS, STEP0=(BLOCK * POS_MUL[0]) & MASK64,
            STEP1=(BLOCK * POS_MUL[1]) & MASK64, num_warps=NUM_WARPS,
        )  # fmt: skip
    return out


def digests(p: Plan, partials: torch.Tensor) -> list[str]:
    """Add each tensor's partials (programs of a tensor are adjacent) and finalize."""
    parts = partials.cpu().numpy().view(np.uint64)
    # Differences of a prefix sum mod 2^64 give every tensor's sum in one pass, empty tensors included.
    prefix = np.zeros((p.programs + 1, 2), dtype=np.uint64)
    np.cumsum(parts, axis=0, dtype=np.uint64, out=prefix[1:])
    ends = np.cumsum(p.programs_per_tensor)
    sums = prefix[ends] - prefix[ends - p.programs_per_tensor]
    return finalize_many(sums[:, 0], sums[:, 1], p.nbytes)


def fingerprint_many_triton(tensors: list[torch.Tensor]) -> list[str]:
    """fp1 digests of CUDA tensors that all live on one device, with a single kernel launch."""
    if not tensors:
        return []
    with torch.no_grad(), torch.cuda.device(tensors[0].device):
        p = plan(tensors)
        return digests(p, launch(p))


def check_against_reference(device: torch.device) -> str | None:
    """Run the kernel on a few awkward tensors; None if it matches the reference, else what differed."""
    gen = torch.Generator().manual_seed(1)
    cases = [
        torch.empty(0),
        torch.tensor(2.5, dtype=torch.float64),
        torch.randint(0, 256, (3,), dtype=torch.uint8, generator=gen),
        torch.randn(5, 3, generator=gen).to(torch.bfloat16).t(),
        torch.randn(7 * BLOCK * ITERS + 17, generator=gen)[1:],
        torch.randn(2 * BLOCK * ITERS, generator=gen),
    ]
    try:
        got = fingerprint_many_triton([c.to(device) for c in cases])
    except Exception as exc:  # a broken Triton install must not break training runs: fall back, loudly
        return f"Triton kernel failed: {type(exc).__name__}: {exc}"
    for case, digest in zip(cases, got, strict=True):
        want = fingerprint_bytes(byte_view(case).numpy().tobytes())
        if digest != want:
            return f"Triton digest {digest} != reference {want} for {case.dtype} {tuple(case.shape)}"
    return None
