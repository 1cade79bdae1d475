"""Digests, stats and drift sketch of a CUDA tensor list from one read of each element.

The recorder needs three things of every recorded tensor at every step: its fingerprint (docs/fingerprint.md),
its stats and its count sketch (detlab.core.sketch, `cs1`). Two passes (detlab.tensors.fingerprint.triton_impl,
then detlab.tensors.drift_triton) read the weights twice and cost the host two sets of launches.

Here an element of row r, column c goes to bucket (b1(c) + b2(r)) mod K with sign s1(c) * s2(r), so rows that
share their row bucket b2 can be added column by column first (each signed by its s2) and mapped to buckets
once. One program takes a chunk of columns (KINDS: 1024, 512 of float64) of up to ROWS_PER_PROGRAM rows of one
tensor that share b2. It loads a few rows' chunks at once as integers (one 16-byte load per thread and row),
adds their values into per-column float64 signed sums (the sketch maps columns to buckets) and, per thread's
16 bytes, into one sum, sum of squares and max |x| (fewer accumulators and adds than per column), and forms
the fingerprint's 64-bit words from the same registers (no second read): word positions count from the
tensor's first word, and an element past the tensor's end loads as zero, which is the spec's padding of a last
partial word, so the lane sums are the fingerprint's exactly. At the end the program maps its columns to their K
buckets, rotated by the group's b2: K + 3 values a program, and adds its lane sums into its tensor's with atomic
integer adds (exact and order-independent). Programs are then added per tensor in a fixed order, and the
finalisation kernel of triton_impl turns lane sums into digests.

A row that covers its chunk whole needs no per-element mask, so its loads are vector loads; a tensor's last row
usually ends inside a chunk and is a program of its own ("partial"). The kernel is compiled per (dtype, full)
and launched once per such group of programs: one dtype's layout and registers per compiled kernel.

The host's per-list work is done once: a `Plan` holds the program and row tables, the per-tensor length keys,
every output buffer and the pinned host buffers, and from its second use a CUDA graph of the whole step (zero,
kernel, per-tensor sums, finalisation, copies to the host), so a step costs the host one graph replay and an
event. Plans are kept per (device, data pointers, byte lengths, dtypes, indices); each holds a few `Slot`s
(buffers and graph) so a step can be queued while an earlier one is still waiting to be read.

Floating tensors only (float32, bfloat16, float16, float64), contiguous and 16-byte aligned: read where they
lie. A list with any other tensor takes the two-pass path (detlab.tensors.onepass decides).
"""

from __future__ import annotations

import functools
import threading
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
import triton
import triton.language as tl

from detlab.core import sketch
from detlab.tensors.digests import SLOTS, recorded_event
from detlab.tensors.fingerprint.reference import DEFAULT_KEY, DigestKey
from detlab.tensors.fingerprint.triton_impl import _finalize_kernel, _mix, _mix_lanes, capture
from detlab.tensors.named import ListKey

# dtype -> (the kernel's element type, the integer type of its bits, elements in a 64-bit word, columns of a row
# that one program reads, rows read at once). With 4 warps a thread holds 8 columns (4 of float64) of each row:
# the fastest of the sizes timed on an H200 that kept every dtype's kernel from spilling registers
# (results/2026-12-03-h200-onepass-vector/kernel_sweep.txt). With the per-thread sums (sm_90, Triton 3.6):
# 80 to 128 registers, no spills but 4 bytes in bfloat16's full-row kernel (results/2026-12-05-h200-sdk-overhead).
KINDS = {torch.float32: (tl.float32, tl.int32, 2, 1024, 2), torch.bfloat16: (tl.bfloat16, tl.int16, 4, 1024, 4),
         torch.float16: (tl.float16, tl.int16, 4, 1024, 4), torch.float64: (tl.float64, tl.int64, 1, 512, 2)}
CODES = {dtype: code for code, dtype in enumerate(KINDS)}
ALIGN = 16
ROW_VALUES = sketch.K + 3  # K buckets, sum, sum of squares, max |x|
ROWS_PER_PROGRAM = 256
NUM_WARPS = 4
KEPT_PLANS = 8
_FINAL_BLOCK = 128
_SUM_BLOCK = 32  # programs' values added at once per tensor


@triton.jit
def _words(bits, R: tl.constexpr, CHUNK: tl.constexpr, PER: tl.constexpr):
    """A tile's 64-bit words, uint64 [R, CHUNK // PER], from its elements' bits [R, CHUNK] (PER a word, in
    little-endian order): the bytes the fingerprint reads, from the registers the stats were taken from."""
    if PER == 2:
        lo, hi = tl.split(tl.reshape(bits, [R, CHUNK // 2, 2]))
        return lo.to(tl.uint32, bitcast=True).to(tl.uint64) | (hi.to(tl.uint32, bitcast=True).to(tl.uint64) << 32)
    elif PER == 4:
        even, odd = tl.split(tl.reshape(bits, [R, CHUNK // 4, 2, 2]))  # elements 0 and 2, 1 and 3 of each word
        e0, e2 = tl.split(even)
        e1, e3 = tl.split(odd)
        return (e0.to(tl.uint16, bitcast=True).to(tl.uint64) | (e1.to(tl.uint16, bitcast=True).to(tl.uint64) << 16)
                | (e2.to(tl.uint16, bitcast=True).to(tl.uint64) << 32)
                | (e3.to(tl.uint16, bitcast=True).to(tl.uint64) << 48))
    else:
        return bits.to(tl.uint64, bitcast=True)


@triton.jit
def _rows(base, q, first, count, row_index, row_sign, row_n, ELEM: tl.constexpr, PER: tl.constexpr,
          FULL: tl.constexpr, COLUMNS: tl.constexpr, CHUNK: tl.constexpr, ROW_TILE: tl.constexpr,
          A1: tl.constexpr, A2: tl.constexpr, A3: tl.constexpr, A4: tl.constexpr, A5: tl.constexpr,
          B1: tl.constexpr, B2: tl.constexpr, B3: tl.constexpr, B4: tl.constexpr, B5: tl.constexpr):
    # One program's rows (ROW_TILE at a time) of chunk q: per column, their signed sum (the sketch maps columns
    # to buckets); per group of G columns (one thread's 16-byte load), their sum, sum of squares and max |x|,
    # and the fingerprint's two lane sums of their words. `base` points at the tensor's elements' bits (16-byte
    # aligned). FULL: every row covers the whole chunk, so a tile's only mask is which of its rows are the
    # program's, constant along a row (vector loads); else the rows end where row_n says.
    W: tl.constexpr = CHUNK // PER  # words of a row's chunk
    G: tl.constexpr = 2 * PER  # elements in 16 bytes (two words): summed in the thread that loaded them
    GROUPS: tl.constexpr = CHUNK // G
    PEAK: tl.constexpr = tl.float64 if PER == 1 else tl.float32  # max |x| is exact in the element's own type
    cols = q * CHUNK + tl.arange(0, CHUNK)
    t = tl.arange(0, ROW_TILE)
    j = tl.arange(0, W).to(tl.uint64)
    step0 = j * 0x9E3779B97F4A7C15  # a word's position key pos * G as (first word's) + j * G: no multiply per word
    step1 = j * 0xD1B54A32D192ED03
    acc = tl.zeros([CHUNK], dtype=tl.float64)
    total = tl.zeros([GROUPS], dtype=tl.float64)
    squares = tl.zeros([GROUPS], dtype=tl.float64)
    peak = tl.zeros([GROUPS], dtype=PEAK)
    lane0 = tl.zeros([GROUPS], dtype=tl.uint64)
    lane1 = tl.zeros([GROUPS], dtype=tl.uint64)
    for i in range(0, count, ROW_TILE):
        live = i + t < count
        r = tl.load(row_index + first + i + t, mask=live, other=0)
        sign = tl.load(row_sign + first + i + t, mask=live, other=0.0)
        at = base + (r[:, None] * COLUMNS + cols[None, :])
        if FULL:
            bits = tl.load(at, mask=live[:, None], other=0)
            keep = live[:, None]
        else:
            n = tl.load(row_n + first + i + t, mask=live, other=0)
            bits = tl.load(at, mask=cols[None, :] < n[:, None], other=0)  # zeros past the end: the spec's padding
            keep = j[None, :] < ((tl.minimum(tl.maximum(n - q * CHUNK, 0), CHUNK) + PER - 1) // PER)[:, None]
        x = bits.to(ELEM, bitcast=True)
        wide = x.to(tl.float64)
        acc += tl.sum(wide * sign[:, None], axis=0)
        grouped = tl.reshape(wide, [ROW_TILE, GROUPS, G])
        total += tl.sum(tl.sum(grouped, axis=2), axis=0)
        squares += tl.sum(tl.sum(grouped * grouped, axis=2), axis=0)
        peak = tl.maximum(peak, tl.max(tl.max(tl.reshape(tl.abs(x), [ROW_TILE, GROUPS, G]), axis=2), axis=0).to(PEAK))
        word = _words(bits, ROW_TILE, CHUNK, PER)
        at_word = ((r * COLUMNS + q * CHUNK) // PER).to(tl.uint64, bitcast=True)  # counted from the tensor's first
        key0 = (at_word * 0x9E3779B97F4A7C15)[:, None] + step0[None, :]
        key1 = (at_word * 0xD1B54A32D192ED03)[:, None] + step1[None, :]
        mixed0 = tl.where(keep, _mix(word ^ key0, A1, A2, A3, A4, A5), 0)
        mixed1 = tl.where(keep, _mix(word ^ key1, B1, B2, B3, B4, B5), 0)
        lane0 += tl.sum(tl.sum(tl.reshape(mixed0, [ROW_TILE, GROUPS, 2]), axis=2), axis=0)
        lane1 += tl.sum(tl.sum(tl.reshape(mixed1, [ROW_TILE, GROUPS, 2]), axis=2), axis=0)
    return acc, total, squares, peak.to(tl.float64), tl.sum(lane0, axis=0), tl.sum(lane1, axis=0)


@triton.jit
def _onepass_kernel(prog0, prog_addr, prog_owner, prog_rot, prog_q, prog_start, prog_count, prog_slot,
                    row_index, row_sign, row_n, col_bucket, col_sign, sums, per_prog,
                    ELEM: tl.constexpr, BITS: tl.constexpr, PER: tl.constexpr, FULL: tl.constexpr,
                    K: tl.constexpr, COLUMNS: tl.constexpr, CHUNK: tl.constexpr, ROW_TILE: tl.constexpr,
                    A1: tl.constexpr, A2: tl.constexpr, A3: tl.constexpr, A4: tl.constexpr, A5: tl.constexpr,
                    B1: tl.constexpr, B2: tl.constexpr, B3: tl.constexpr, B4: tl.constexpr, B5: tl.constexpr):
    # One launch per (dtype, FULL) group of programs, which starts at prog0 in the tables: one dtype's layout and
    # registers per compiled kernel.
    p = prog0 + tl.program_id(0)
    q = tl.load(prog_q + p)
    base = tl.multiple_of(tl.load(prog_addr + p).to(tl.pointer_type(BITS)), 16)
    acc, total, squares, peak, l0, l1 = _rows(base, q, tl.load(prog_start + p), tl.load(prog_count + p), row_index,
                                              row_sign, row_n, ELEM, PER, FULL, COLUMNS, CHUNK, ROW_TILE,
                                              A1, A2, A3, A4, A5, B1, B2, B3, B4, B5)
    # The column map once per program: column c's signed sum goes to bucket b1(c), rotated by the rows' b2.
    o = per_prog + tl.load(prog_slot + p) * (K + 3)
    rot = tl.load(prog_rot + p)
    cols = q * CHUNK + tl.arange(0, CHUNK)
    bucket = tl.load(col_bucket + cols)
    signed = acc * tl.load(col_sign + cols)
    for k in tl.static_range(K):
        tl.store(o + (k + rot) % K, tl.sum(tl.where(bucket == k, signed, 0.0), axis=0))
    tl.store(o + K, tl.sum(total, axis=0))
    tl.store(o + K + 1, tl.sum(squares, axis=0))
    tl.store(o + K + 2, tl.max(peak, axis=0))
    owner = tl.load(prog_owner + p)
    tl.atomic_add(sums + 2 * owner, l0.to(tl.int64, bitcast=True))
    tl.atomic_add(sums + 2 * owner + 1, l1.to(tl.int64, bitcast=True))


@triton.jit
def _per_tensor_kernel(per_prog, tensor_lo, tensor_hi, values, K: tl.constexpr, BLOCK: tl.constexpr,
                       V: tl.constexpr):
    # A tensor's rows of values (rows [lo, hi) of per_prog: K bucket sums, sum, sum of squares, max |x|) added in a
    # fixed order (blocks of BLOCK, each a fixed tree): the same bits on every run, where float64 atomics
    # (index_add_) add in whatever order the programs finish. Also serves detlab.tensors.drift_triton.
    t = tl.program_id(0)
    lo = tl.load(tensor_lo + t)
    hi = tl.load(tensor_hi + t)
    j = tl.arange(0, V)
    live = j < K + 3
    acc = tl.zeros([V], dtype=tl.float64)
    peak = tl.zeros([V], dtype=tl.float64)
    for b in range(lo, hi, BLOCK):
        rows = b + tl.arange(0, BLOCK)
        block = tl.load(per_prog + rows[:, None] * (K + 3) + j[None, :], mask=(rows < hi)[:, None] & live[None, :],
                        other=0.0)
        acc += tl.sum(block, axis=0)
        peak = tl.maximum(peak, tl.max(block, axis=0))
    out = values + t * (K + 3)  # sum, L2 norm, max |x|, then the sketch
    tl.store(out, tl.sum(tl.where(j == K, acc, 0.0), axis=0))
    tl.store(out + 1, tl.sqrt(tl.sum(tl.where(j == K + 1, acc, 0.0), axis=0)))
    tl.store(out + 2, tl.max(tl.where(j == K + 2, peak, 0.0), axis=0))
    tl.store(out + 3 + j, acc, mask=j < K)


def add_per_tensor(per_row: torch.Tensor, lo: torch.Tensor, hi: torch.Tensor, out: torch.Tensor) -> None:
    """Queue out[i] = rows [lo[i], hi[i]) of per_row [rows, K + 3] added in a fixed order, as (sum, L2 norm, max
    |x|, the K sketch values): the same bits on every run. Allocates nothing."""
    _per_tensor_kernel[(out.shape[0],)](per_row, lo, hi, out, K=sketch.K, BLOCK=_SUM_BLOCK,
                                        V=triton.next_power_of_2(ROW_VALUES))


def supported(t: torch.Tensor) -> bool:
    """Read in place by the kernel: a contiguous, 16-byte aligned tensor of a floating dtype it loads."""
    return (t.dtype in CODES and t.layout == torch.strided and t.is_contiguous() and not t.is_conj()
            and not t.is_neg() and type(t).__torch_dispatch__ is torch.Tensor.__torch_dispatch__
            and t.data_ptr() % ALIGN == 0)


@functools.cache
def _column_map(device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Each of the sketch's columns' bucket and sign, on `device`."""
    b1, s1 = sketch.column_map()
    return torch.from_numpy(b1.astype(np.int32)).to(device), torch.from_numpy(s1).to(device)


@dataclass(eq=False)
class Slot:
    """One queued step's buffers: lane sums, per-program values, the results and their pinned host copy."""

    sums: torch.Tensor  # int64[n, 2]
    per_prog: torch.Tensor  # float64[programs, K + 3]
    results: torch.Tensor  # int64[n * (2 + 3 + K)]: `final`, then `values`' bits: one copy to the host
    final: torch.Tensor  # int64[n, 2] digests, a view of `results`
    values: torch.Tensor  # float64[n, 3 + K]: sum, L2 norm, max |x|, then the sketch; a view of `results`
    host: torch.Tensor  # pinned, as `results`
    graph: torch.cuda.CUDAGraph | None = None
    runs: int = 0
    busy: bool = False


@dataclass(eq=False)
class Plan:
    """What a list's layout fixes: the program and row tables on the device, the length keys, the slots."""

    device: torch.device
    key: DigestKey
    tensors: int
    programs: int
    table: tuple[torch.Tensor, ...]  # as _onepass_kernel's arguments, prog_addr to row_n
    groups: list[tuple[tuple[Any, ...], bool, int, int]]  # launches: (KINDS entry, full, first program, programs)
    tensor_start: torch.Tensor  # int64[n + 1]: tensor i's programs are [start[i], start[i + 1])
    len_mix: torch.Tensor  # int64[n, 2]
    slots: list[Slot] = field(default_factory=list)
    capturable: bool = True
    lock: threading.Lock = field(default_factory=threading.Lock)


def _programs(n: int, b2: np.ndarray, chunk: int) -> tuple[np.ndarray, ...]:
    """One tensor's programs, as (rotation, chunk, rows' start in the tensor's row list, row count, full), and its
    row list: the rows (of `n` elements in all, row bucket `b2`) with something in each chunk. The rows that cover
    a chunk whole are grouped by b2 and cut into runs of at most ROWS_PER_PROGRAM (full programs); a last row
    that ends inside the chunk is a program of its own."""
    C = sketch.COLUMNS  # noqa: N806
    listed, progs = [], []
    at = 0
    for q in range(C // chunk):
        reach = -(-(n - q * chunk) // C) if n > q * chunk else 0  # rows reaching into chunk q
        short = reach > 0 and n - (reach - 1) * C < (q + 1) * chunk  # the last of them ends inside it
        whole = np.arange(reach - 1 if short else reach)
        order = whole[np.argsort(b2[whole], kind="stable")]
        keys = b2[order]
        cut = np.flatnonzero(np.diff(keys)) + 1
        for group in np.split(np.arange(order.size), cut):
            for s in range(0, group.size, ROWS_PER_PROGRAM):
                part = group[s : s + ROWS_PER_PROGRAM]
                progs.append((keys[part[0]], q, at + part[0], part.size, 1))
        if short:
            progs.append((b2[reach - 1], q, at + order.size, 1, 0))
            order = np.append(order, reach - 1)
        listed.append(order)
        at += order.size
    return np.array(progs, dtype=np.int64).reshape(-1, 5), np.concatenate(listed)


def plan(tensors: Sequence[torch.Tensor], indices: Sequence[int], key: DigestKey = DEFAULT_KEY) -> Plan:
    """The program and row tables of `tensors` (each `supported`, one device); `indices`: each one's index in the
    recorded list (the sketch's row map depends on it)."""
    device = tensors[0].device
    C = sketch.COLUMNS  # noqa: N806
    prog_parts: list[np.ndarray] = []
    row_parts: list[np.ndarray] = []
    rows_before = 0
    for i, t in enumerate(tensors):
        n = t.numel()
        if not n:
            continue
        b2, s2 = sketch.row_map(indices[i], sketch.rows_of(n))
        progs, listed = _programs(n, b2, KINDS[t.dtype][3])
        prog_parts.append(np.column_stack([np.full(len(progs), t.data_ptr()), np.full(len(progs), CODES[t.dtype]),
                                           np.full(len(progs), i), progs[:, :3] + [0, 0, rows_before], progs[:, 3:]]))
        row_parts.append(np.column_stack([listed, s2[listed].view(np.int64), np.minimum(n - listed * C, C)]))
        rows_before += listed.size
    progs = np.concatenate(prog_parts) if prog_parts else np.zeros((0, 8), dtype=np.int64)
    rows = np.concatenate(row_parts) if row_parts else np.zeros((0, 3), dtype=np.int64)
    # Programs write their values in the tensors' order (slot), and are launched grouped by (dtype, full).
    order = np.lexsort((1 - progs[:, 7], progs[:, 1]))
    kinds = list(KINDS.values())
    groups = [(kinds[code], bool(full), int(lo), int(hi - lo)) for code, full, lo, hi in _runs(progs[order][:, [1, 7]])]
    progs = np.column_stack([progs[order][:, [0, 2, 3, 4, 5, 6]], order])
    dtypes = (torch.int64, torch.int64, torch.int32, torch.int32, torch.int64, torch.int32, torch.int64)
    table = tuple(torch.from_numpy(np.ascontiguousarray(progs[:, j])).to(device, dt) for j, dt in enumerate(dtypes))
    table += (torch.from_numpy(np.ascontiguousarray(rows[:, 0])).to(device),
              torch.from_numpy(np.ascontiguousarray(rows[:, 1])).view(torch.float64).to(device),
              torch.from_numpy(np.ascontiguousarray(rows[:, 2])).to(device))
    nb = np.array([t.numel() * t.element_size() for t in tensors], dtype=np.uint64)
    len_mix = _mix_lanes(nb[:, None] ^ np.array(key.len_key, dtype=np.uint64), key).view(np.int64)
    start = np.searchsorted(progs[:, 1][np.argsort(order)], np.arange(len(tensors) + 1))  # slots: tensor by tensor
    return Plan(device=device, key=key, tensors=len(tensors), programs=len(progs), table=table, groups=groups,
                tensor_start=torch.from_numpy(start.astype(np.int64)).to(device),
                len_mix=torch.from_numpy(np.ascontiguousarray(len_mix)).to(device))


def _runs(keys: np.ndarray) -> list[tuple[int, int, int, int]]:
    """(key columns, start, end) of each run of equal rows of `keys` [m, 2]."""
    cut = np.flatnonzero((np.diff(keys, axis=0) != 0).any(axis=1)) + 1
    bounds = np.concatenate([[0], cut, [len(keys)]]) if len(keys) else np.zeros(0, dtype=np.int64)
    return [(*keys[lo], lo, hi) for lo, hi in zip(bounds[:-1], bounds[1:], strict=True)]


def _new_slot(p: Plan) -> Slot:
    n, dev = p.tensors, p.device
    results = torch.zeros(n * (2 + ROW_VALUES), dtype=torch.int64, device=dev)
    return Slot(sums=torch.zeros((n, 2), dtype=torch.int64, device=dev),
                per_prog=torch.zeros((p.programs, ROW_VALUES), dtype=torch.float64, device=dev),
                results=results, final=results[: 2 * n].view(n, 2),
                values=results[2 * n :].view(torch.float64).view(n, ROW_VALUES),
                host=torch.zeros_like(results, device="cpu", pin_memory=dev.type == "cuda"))


def compute(p: Plan, s: Slot) -> None:
    """Queue the whole step into slot `s`: zero the lane sums, the one-pass kernel, per-tensor sums (every row of
    `values`: no zeroing), finalisation, one copy to the slot's host buffer. Allocates nothing (capturable as a
    CUDA graph)."""
    s.sums.zero_()
    (a1, a2, a3, a4, a5), (b1, b2, b3, b4, b5) = p.key.mixers
    K = sketch.K  # noqa: N806
    if p.programs:
        for (elem, bits, per, chunk, tile), full, first, count in p.groups:
            _onepass_kernel[(count,)](first, *p.table, *_column_map(p.device), s.sums, s.per_prog, ELEM=elem,
                                      BITS=bits, PER=per, FULL=full, K=K, COLUMNS=sketch.COLUMNS,
                                      CHUNK=chunk, ROW_TILE=tile, num_warps=NUM_WARPS,
                                      A1=a1, A2=a2, A3=a3, A4=a4, A5=a5, B1=b1, B2=b2, B3=b3, B4=b4, B5=b5)
        add_per_tensor(s.per_prog, p.tensor_start, p.tensor_start[1:], s.values)
    _finalize_kernel[(triton.cdiv(p.tensors, _FINAL_BLOCK),)](s.sums, p.len_mix, s.final, p.tensors,
                                                               BLOCK=_FINAL_BLOCK, A1=a1, A2=a2, A3=a3, A4=a4,
                                                               A5=a5, B1=b1, B2=b2, B3=b3, B4=b4, B5=b5)
    s.host.copy_(s.results, non_blocking=True)


def _capture(p: Plan, s: Slot) -> None:
    try:
        s.graph = capture(functools.partial(compute, p, s))  # allocates nothing
    except RuntimeError as exc:  # e.g. the caller is capturing a graph itself: launch directly instead
        p.capturable = False
        warnings.warn(f"detlab: recording without a CUDA graph ({exc})", RuntimeWarning, stacklevel=4)


def run(p: Plan, s: Slot) -> None:
    """Queue a step on the current stream: the slot's graph if it has one, else the launches (and, from the
    slot's second run, capture them)."""
    if s.graph is not None:
        s.graph.replay()
        return
    if s.runs and p.capturable and p.device.type == "cuda":
        _capture(p, s)
        if s.graph is not None:
            s.graph.replay()
            return
    compute(p, s)
    s.runs += 1


def read(p: Plan, s: Slot) -> tuple[bytes, np.ndarray]:
    """The packed digests (as fingerprint.digests_to_bytes packs them) and the [n, 3 + K] values of a run whose
    copies are known to be done."""
    host = s.host.numpy()
    packed = host[: 2 * p.tensors].view(np.uint64).astype(">u8").tobytes()
    return packed, host[2 * p.tensors :].view(np.float64).reshape(p.tensors, ROW_VALUES).copy()


class OnePass:
    """Queues digests and drift data of tensor lists; keeps each list's plan and slots between calls."""

    def __init__(self, kept: int = KEPT_PLANS) -> None:
        self._kept = kept
        self._plans: dict[ListKey, Plan] = {}
        self._lock = threading.Lock()

    def _slot(self, key: ListKey, tensors: Sequence[torch.Tensor]) -> tuple[Plan, Slot] | None:
        with self._lock:
            p = self._plans.pop(key, None)
            if p is None:
                # Checked once per plan: a kept plan's key (pointers, shapes, strides, dtypes, bits) pins the rest.
                if not all(map(supported, tensors)):
                    return None
                with torch.no_grad():
                    p = plan(tensors, range(len(tensors)))
            self._plans[key] = p  # most recently used last
            while len(self._plans) > self._kept:
                self._plans.pop(next(iter(self._plans)))
            for s in p.slots:
                if not s.busy:
                    s.busy = True
                    return p, s
            s = _new_slot(p)  # every slot awaits its reader: one more (bounded by the reader's pace)
            if len(p.slots) < SLOTS:
                p.slots.append(s)
            s.busy = True
            return p, s

    def _release(self, s: Slot) -> None:
        with self._lock:
            s.busy = False

    def submit(self, tensors: Sequence[torch.Tensor], key: ListKey | None = None) -> Any:
        """Queue the work for `tensors` (on one CUDA device; `key`: their ListKey, made here if not given) on the
        current stream; returns a function, callable from any thread, that waits for this step's copies alone and
        gives (packed digests, float64[n, 3 + K] values); None, queueing nothing, if a tensor is not `supported`.
        A tensor's sketch rows are mapped by its index in `tensors`."""
        found = self._slot(key if key is not None else ListKey(tensors), tensors)
        if found is None:
            return None
        p, s = found
        with torch.cuda.device(p.device):
            run(p, s)
            done = recorded_event()

        def result() -> tuple[bytes, np.ndarray]:
            done.synchronize()  # this step only; releases the GIL while it waits
            try:
                return read(p, s)
            finally:
                self._release(s)

        return result
