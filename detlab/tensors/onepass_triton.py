"""Digests, stats and drift sketch of a CUDA tensor list from one read of each element: one Triton launch.

The recorder needs three things of every recorded tensor at every step: its fingerprint (docs/fingerprint.md),
its stats and its count sketch (detlab.core.sketch, `cs1`). Two passes (detlab.tensors.fingerprint.triton_impl,
then detlab.tensors.drift_triton) read the weights twice and cost the host two sets of launches. Here one
program takes one sketch row (COLUMNS elements) of one tensor: it reads the row's elements for the stats and
the sketch, bucket by bucket (the columns sorted by bucket once on the host: per bucket one gather and one
sum, where a one-hot select of every element into K buckets took 1.27 ms a step for GPT-2 small's
parameters on an H200 and this takes 0.92 ms, .sum() 0.12 ms: float64 arithmetic, not memory, bounds it),
and the row's bytes as 64-bit words for the fingerprint (the same 8-16 KiB, read from memory once,
the second load served by the cache), writes the row's K rotated, signed bucket sums, sum, sum of squares
and max |x|, and adds its two fingerprint lane terms into its tensor's lane sums with atomic integer adds
(exact and order-independent). A sketch row starts at a multiple of COLUMNS elements, so at a whole word
(COLUMNS * element size is a multiple of 8), and word positions are the row's first word plus its index:
the lane sums are the fingerprint's exactly. Rows are then added per tensor as drift_triton adds them, and
the finalisation kernel of triton_impl turns lane sums into digests.

The host's per-list work is done once: a `Plan` holds the row table, the per-tensor length keys, every
output buffer and the pinned host buffers, and from its second use a CUDA graph of the whole step (zero,
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
from detlab.tensors.fingerprint.reference import DEFAULT_KEY, DigestKey
from detlab.tensors.fingerprint.triton_impl import _finalize_kernel, _mix, _mix_lanes

# dtype -> (code the kernel branches on, element size)
CODES = {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2, torch.float64: 3}
ALIGN = 16
ROW_VALUES = sketch.K + 3  # K buckets, sum, sum of squares, max |x|
WORD_BLOCK = 512  # words per inner fingerprint step
NUM_WARPS = 4
SLOTS = 3  # steps of one list that may be queued and not yet read
KEPT_PLANS = 8
_FINAL_BLOCK = 128


@triton.jit
def _onepass_kernel(row_addr, row_n, row_bytes, row_word0, row_bucket, row_sign, row_owner, row_code,
                    col_order, col_sign, bucket_start, sums, per_row,
                    K: tl.constexpr, MAXB: tl.constexpr, WB: tl.constexpr,
                    A1: tl.constexpr, A2: tl.constexpr, A3: tl.constexpr, A4: tl.constexpr, A5: tl.constexpr,
                    B1: tl.constexpr, B2: tl.constexpr, B3: tl.constexpr, B4: tl.constexpr, B5: tl.constexpr):
    r = tl.program_id(0)
    addr = tl.load(row_addr + r)
    n = tl.load(row_n + r)
    code = tl.load(row_code + r)
    row_bucket_r = tl.load(row_bucket + r)
    row_sign_r = tl.load(row_sign + r)
    o = per_row + r * (K + 3)
    total = tl.zeros([MAXB], dtype=tl.float64)
    squares = tl.zeros([MAXB], dtype=tl.float64)
    peak = tl.zeros([MAXB], dtype=tl.float64)
    # Bucket by bucket: the columns of bucket k (sorted by bucket on the host) gathered from the row, signed and
    # summed; every column lies in one bucket, so the stats see every element once.
    for k in tl.static_range(K):
        j = tl.load(bucket_start + k) + tl.arange(0, MAXB)
        live = j < tl.load(bucket_start + k + 1)
        cols = tl.load(col_order + j, mask=live, other=0)
        m = live & (cols < n)
        if code == 0:
            x = tl.load(addr.to(tl.pointer_type(tl.float32)) + cols, mask=m, other=0).to(tl.float64)
        elif code == 1:
            x = tl.load(addr.to(tl.pointer_type(tl.bfloat16)) + cols, mask=m, other=0).to(tl.float64)
        elif code == 2:
            x = tl.load(addr.to(tl.pointer_type(tl.float16)) + cols, mask=m, other=0).to(tl.float64)
        else:
            x = tl.load(addr.to(tl.pointer_type(tl.float64)) + cols, mask=m, other=0)
        # The row's own bucket rotates its sums and its sign signs them: element bucket (b1 + b2) mod K.
        bucket = tl.sum(x * tl.load(col_sign + j, mask=live, other=0.0), axis=0)
        tl.store(o + (k + row_bucket_r) % K, bucket * row_sign_r)
        total += x
        squares += x * x
        peak = tl.maximum(peak, tl.abs(x))
    tl.store(o + K, tl.sum(total, axis=0))
    tl.store(o + K + 1, tl.sum(squares, axis=0))
    tl.store(o + K + 2, tl.max(peak, axis=0))
    # The fingerprint's lane terms of the row's bytes (the same memory, now in cache), zero-padding a last
    # partial word as the spec does.
    nbytes = tl.load(row_bytes + r)
    nwords = nbytes // 8
    padded = (nbytes + 7) // 8
    word0 = tl.load(row_word0 + r)
    base = addr.to(tl.pointer_type(tl.int64))
    rest = nbytes - nwords * 8
    b = tl.arange(0, 8)
    tail = tl.load(addr.to(tl.pointer_type(tl.uint8)) + nwords * 8 + b, mask=b < rest, other=0)
    tail_word = tl.sum(tail.to(tl.uint64) << (b * 8).to(tl.uint64), axis=0)  # disjoint bits: sum == or
    acc0 = tl.zeros([WB], dtype=tl.uint64)
    acc1 = tl.zeros([WB], dtype=tl.uint64)
    for w in range(0, padded, WB):
        idx = w + tl.arange(0, WB)
        word = tl.load(base + idx, mask=idx < nwords, other=0).to(tl.uint64, bitcast=True)
        word = tl.where(idx == nwords, tail_word, word)
        pos = (word0 + idx).to(tl.uint64, bitcast=True)
        live = idx < padded
        acc0 += tl.where(live, _mix(word ^ (pos * 0x9E3779B97F4A7C15), A1, A2, A3, A4, A5), 0)
        acc1 += tl.where(live, _mix(word ^ (pos * 0xD1B54A32D192ED03), B1, B2, B3, B4, B5), 0)
    i = tl.load(row_owner + r)
    tl.atomic_add(sums + 2 * i, tl.sum(acc0, axis=0).to(tl.int64, bitcast=True))
    tl.atomic_add(sums + 2 * i + 1, tl.sum(acc1, axis=0).to(tl.int64, bitcast=True))


def supported(t: torch.Tensor) -> bool:
    """Read in place by the kernel: a contiguous, 16-byte aligned tensor of a floating dtype it loads."""
    return (t.dtype in CODES and t.layout == torch.strided and t.is_contiguous() and not t.is_conj()
            and not t.is_neg() and type(t).__torch_dispatch__ is torch.Tensor.__torch_dispatch__
            and t.data_ptr() % ALIGN == 0)


@functools.cache
def _column_map(device: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, int]:
    """The sketch's columns sorted by bucket, their signs in that order, where each bucket starts, and the
    largest bucket rounded up to a power of two (the lanes of one gather)."""
    b1, s1 = sketch.column_map()
    order = np.argsort(b1, kind="stable")
    start = np.concatenate([[0], np.cumsum(np.bincount(b1, minlength=sketch.K))])
    return (torch.from_numpy(order.astype(np.int32)).to(device), torch.from_numpy(s1[order]).to(device),
            torch.from_numpy(start.astype(np.int32)).to(device), triton.next_power_of_2(int(np.diff(start).max())))


@dataclass(eq=False)
class Slot:
    """One queued step's buffers: lane sums, per-row values, per-tensor results, their pinned host copies."""

    sums: torch.Tensor  # int64[n, 2]
    per_row: torch.Tensor  # float64[rows, K + 3]
    values: torch.Tensor  # float64[n, 3 + K]: sum, L2 norm, max |x|, then the sketch
    final: torch.Tensor  # int64[n, 2] digests
    host_digests: torch.Tensor  # pinned
    host_values: torch.Tensor  # pinned
    graph: torch.cuda.CUDAGraph | None = None
    runs: int = 0
    busy: bool = False


@dataclass(eq=False)
class Plan:
    """What a list's layout fixes: the row table on the device, the length keys, the slots."""

    device: torch.device
    key: DigestKey
    tensors: int
    rows: int
    table: tuple[torch.Tensor, ...]  # row_addr, row_n, row_bytes, row_word0, row_bucket, row_sign, row_owner, row_code
    owner: torch.Tensor  # = table[6]
    len_mix: torch.Tensor  # int64[n, 2]
    slots: list[Slot] = field(default_factory=list)
    capturable: bool = True
    lock: threading.Lock = field(default_factory=threading.Lock)


def plan(tensors: Sequence[torch.Tensor], indices: Sequence[int], key: DigestKey = DEFAULT_KEY) -> Plan:
    """The row table of `tensors` (each `supported`, one device); `indices`: each one's index in the recorded
    list (the sketch's row map depends on it)."""
    device = tensors[0].device
    parts: list[list[np.ndarray]] = [[] for _ in range(8)]
    C = sketch.COLUMNS  # noqa: N806
    for i, t in enumerate(tensors):
        n = t.numel()
        if not n:
            continue
        size = t.element_size()
        rows = sketch.rows_of(n)
        first = np.arange(rows, dtype=np.int64) * C
        counts = np.minimum(n - first, C)
        b2, s2 = sketch.row_map(indices[i], rows)
        row: tuple[np.ndarray, ...] = (t.data_ptr() + first * size, counts, counts * size, first * size // 8,
                                       b2.astype(np.int32), s2.astype(np.float64), np.full(rows, i, dtype=np.int64),
                                       np.full(rows, CODES[t.dtype], dtype=np.int32))
        for part, values in zip(parts, row, strict=True):
            part.append(values)
    empty = (np.int64, np.int64, np.int64, np.int64, np.int32, np.float64, np.int64, np.int32)
    columns = [np.concatenate(p) if p else np.zeros(0, dtype=d) for p, d in zip(parts, empty, strict=True)]
    table = tuple(torch.from_numpy(c).to(device) for c in columns)
    nb = np.array([t.numel() * t.element_size() for t in tensors], dtype=np.uint64)
    len_mix = _mix_lanes(nb[:, None] ^ np.array(key.len_key, dtype=np.uint64), key).view(np.int64)
    return Plan(device=device, key=key, tensors=len(tensors), rows=int(columns[0].size), table=table,
                owner=table[6], len_mix=torch.from_numpy(np.ascontiguousarray(len_mix)).to(device))


def _new_slot(p: Plan) -> Slot:
    n, dev = p.tensors, p.device
    pin = dev.type == "cuda"
    return Slot(sums=torch.zeros((n, 2), dtype=torch.int64, device=dev),
                per_row=torch.zeros((p.rows, ROW_VALUES), dtype=torch.float64, device=dev),
                values=torch.zeros((n, sketch.STATS + sketch.K), dtype=torch.float64, device=dev),
                final=torch.zeros((n, 2), dtype=torch.int64, device=dev),
                host_digests=torch.zeros((n, 2), dtype=torch.int64, pin_memory=pin),
                host_values=torch.zeros((n, sketch.STATS + sketch.K), dtype=torch.float64, pin_memory=pin))


def compute(p: Plan, s: Slot) -> None:
    """Queue the whole step into slot `s`: zero, the one-pass kernel, per-tensor sums, finalisation, copies
    to the slot's host buffers. Allocates nothing (capturable as a CUDA graph)."""
    s.sums.zero_()
    s.values.zero_()
    (a1, a2, a3, a4, a5), (b1, b2, b3, b4, b5) = p.key.mixers
    K = sketch.K  # noqa: N806
    if p.rows:
        order, sign, start, maxb = _column_map(p.device)
        _onepass_kernel[(p.rows,)](*p.table, order, sign, start, s.sums, s.per_row, K=K, MAXB=maxb, WB=WORD_BLOCK,
                                   num_warps=NUM_WARPS,
                                   A1=a1, A2=a2, A3=a3, A4=a4, A5=a5, B1=b1, B2=b2, B3=b3, B4=b4, B5=b5)
        s.values[:, 0].index_add_(0, p.owner, s.per_row[:, K])
        s.values[:, 1].index_add_(0, p.owner, s.per_row[:, K + 1])
        s.values[:, 2].scatter_reduce_(0, p.owner, s.per_row[:, K + 2], reduce="amax")
        s.values[:, sketch.STATS:].index_add_(0, p.owner, s.per_row[:, :K])
    s.values[:, 1].sqrt_()
    _finalize_kernel[(triton.cdiv(p.tensors, _FINAL_BLOCK),)](s.sums, p.len_mix, s.final, p.tensors,
                                                               BLOCK=_FINAL_BLOCK, A1=a1, A2=a2, A3=a3, A4=a4,
                                                               A5=a5, B1=b1, B2=b2, B3=b3, B4=b4, B5=b5)
    s.host_digests.copy_(s.final, non_blocking=True)
    s.host_values.copy_(s.values, non_blocking=True)


def _capture(p: Plan, s: Slot) -> None:
    """As triton_impl._capture: on a side stream, without emptying the allocator's cache."""
    graph = torch.cuda.CUDAGraph()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    try:
        with torch.cuda.stream(side):
            graph.capture_begin(capture_error_mode="thread_local")
            try:
                compute(p, s)
            finally:
                graph.capture_end()
    except RuntimeError as exc:  # e.g. the caller is capturing a graph itself: launch directly instead
        p.capturable = False
        warnings.warn(f"detlab: recording without a CUDA graph ({exc})", RuntimeWarning, stacklevel=4)
        return
    finally:
        torch.cuda.current_stream().wait_stream(side)
    s.graph = graph


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


def read(p: Plan, s: Slot) -> tuple[list[str], np.ndarray]:
    """The digests and the [n, 3 + K] values of a run whose copies are known to be done."""
    hexed = s.host_digests.numpy().view(np.uint64).astype(">u8").tobytes().hex()
    return [f"{p.key.prefix}:{hexed[i : i + 32]}" for i in range(0, len(hexed), 32)], s.host_values.numpy().copy()


class OnePass:
    """Queues digests and drift data of tensor lists; keeps each list's plan and slots between calls."""

    def __init__(self, kept: int = KEPT_PLANS) -> None:
        self._kept = kept
        self._plans: dict[tuple[Any, ...], Plan] = {}
        self._lock = threading.Lock()

    def _slot(self, key: tuple[Any, ...], tensors: Sequence[torch.Tensor],
              indices: Sequence[int]) -> tuple[Plan, Slot] | None:
        with self._lock:
            p = self._plans.pop(key, None)
            if p is None:
                # Checked once per plan: a kept plan's key (pointers, sizes, dtypes, contiguity) pins the rest.
                if not all(map(supported, tensors)):
                    return None
                with torch.no_grad():
                    p = plan(tensors, indices)
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

    def submit(self, tensors: Sequence[torch.Tensor], indices: Sequence[int]) -> Any:
        """Queue the work for `tensors` (on one CUDA device) on the current stream; returns a function, callable
        from any thread, that waits for this step's copies alone and gives (digests, float64[n, 3 + K]
        values); None, queueing nothing, if a tensor is not `supported`."""
        T = torch.Tensor  # noqa: N806
        key = (tensors[0].device, tuple(map(T.data_ptr, tensors)), tuple(t.nbytes for t in tensors),
               tuple(t.dtype for t in tensors), tuple(map(T.is_contiguous, tensors)),
               tuple(map(T.is_conj, tensors)), tuple(map(T.is_neg, tensors)), tuple(indices))
        found = self._slot(key, tensors, indices)
        if found is None:
            return None
        p, s = found
        with torch.cuda.device(p.device):
            run(p, s)
            done = torch.cuda.Event()
            done.record()

        def result() -> tuple[list[str], np.ndarray]:
            done.synchronize()  # this step only; releases the GIL while it waits
            try:
                return read(p, s)
            finally:
                self._release(s)

        return result
