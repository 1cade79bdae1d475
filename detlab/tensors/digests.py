"""Digests of a tensor list queued now and read later, so that recording does not wait for the GPU.

Why this is correct: a tensor must be read before anything changes it. On CUDA (where the Triton kernel
passed its self-check) one launch per device hashes the whole list, queued on that device's *current
stream* at the moment of the call; the loop's later work on that stream (the optimizer's next step) is
queued after it, so the kernel reads exactly the bytes the caller saw. The lane sums are copied to pinned
host memory in the same stream and a CUDA event is recorded; `Pending.packed()` (called from the
recorder's writer thread) waits for that event alone, never the stream, then finishes the digests on the
host. A launch's buffers stay reserved until its result is read, so a later step never overwrites them.
A loop that changes its tensors on *another* stream must make that stream wait for the current one.

CPU tensors, and CUDA tensors where Triton is not available, are hashed synchronously at the call:
`fingerprint_many` in one call for the list. A DTensor is hashed as its local shard on this rank.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

    from detlab.tensors.named import ListKey

# Distinct tensor lists whose launch plans are kept (parameters keep their storage from step to step;
# gradients set to None are usually reallocated at the same addresses).
KEPT_LISTS = 8
# Launches of one list that may be queued and not yet read, each with its own buffers and CUDA graph (in this queue
# and in the one-pass queue): as many as the recorder can hold, its writer's queue (detlab.sdk.spool.DEPTH waiting,
# one being written) and the step being queued. A launch beyond them gets buffers of its own, launches without a
# graph and is not kept: a reader that falls behind, or never reads, costs time, never memory without bound.
SLOTS = 6


@dataclass(eq=False)
class _Slot:
    """One launch plan and whether a queued launch of it still awaits its result."""

    plan: Any  # detlab.tensors.fingerprint.triton_impl.Plan
    busy: bool = True


class Pending:
    """Digests of one list, in its order, packed (DIGEST_BYTES each); `packed()` blocks until they are all on the
    host."""

    def __init__(self, n: int) -> None:
        self._n = n
        self._parts: list[tuple[list[int], Callable[[], bytes]]] = []

    def add(self, indices: list[int], read: Callable[[], bytes]) -> None:
        """The packed digests of the tensors at `indices`, in that order, as `read()` will return them."""
        self._parts.append((indices, read))

    def packed(self) -> bytes:
        """Every digest, packed, in the list's order (waits for the GPU where it must)."""
        from detlab.tensors.fingerprint import split_packed

        if len(self._parts) == 1 and len(self._parts[0][0]) == self._n:  # one part: the whole list, in order
            return self._parts[0][1]()
        pieces = [b""] * self._n
        for indices, read in self._parts:
            for i, digest in zip(indices, split_packed(read()), strict=True):
                pieces[i] = digest
        return b"".join(pieces)


class Digester:
    """Queues digests (the current version) of tensor lists; keeps Triton launch plans per list between calls."""

    def __init__(self, kept: int = KEPT_LISTS) -> None:
        self._kept = kept  # distinct tensor lists whose launch plans are kept
        self._plans: OrderedDict[ListKey, list[_Slot]] = OrderedDict()
        self._lock = threading.Lock()  # `busy` is cleared by the thread that reads a result

    def submit(self, tensors: Sequence[torch.Tensor], key: ListKey | None = None) -> Pending:
        """Queue the digests of `tensors` (read as they are now); the result may be read from any thread. `key`:
        the list's ListKey where the caller has it (a list of local tensors: no DTensor)."""
        from detlab.tensors import fingerprint as fp
        from detlab.tensors.named import ListKey, local

        if key is None:
            tensors = local(tensors)
        pending = Pending(len(tensors))
        if key is not None and key.device is not None:
            by_device = {key.device: list(range(len(tensors)))}
        else:
            by_device = {}
            for i, t in enumerate(tensors):
                by_device.setdefault(t.device, []).append(i)
        for device, idx in by_device.items():
            group = tensors if len(idx) == len(tensors) else [tensors[i] for i in idx]
            if device.type == "cuda" and fp.implementation_name(device) == "triton":
                own = key if key is not None and len(idx) == len(tensors) else ListKey(group)  # the caller's: whole
                pending.add(idx, self._launch(device, group, own))
            else:
                pending.add(idx, _ready(fp.digests_to_bytes(fp.fingerprint_many(group))))
        return pending

    def _slot(self, key: ListKey) -> _Slot | None:
        with self._lock:
            slots = self._plans.get(key)
            if slots is None:
                return None
            self._plans.move_to_end(key)
            for slot in slots:
                if not slot.busy:
                    slot.busy = True
                    return slot
            return None

    def _keep(self, key: ListKey, slot: _Slot) -> None:
        with self._lock:
            slots = self._plans.setdefault(key, [])
            if len(slots) < SLOTS:
                slots.append(slot)
            self._plans.move_to_end(key)
            while len(self._plans) > self._kept:
                self._plans.popitem(last=False)

    def _release(self, slot: _Slot) -> None:
        with self._lock:
            slot.busy = False

    def _launch(self, device: torch.device, group: Sequence[torch.Tensor], key: ListKey) -> Callable[[], bytes]:
        import torch

        from detlab.tensors.fingerprint import triton_impl

        with torch.cuda.device(device):
            slot = self._slot(key)
            if slot is None:
                with torch.no_grad():
                    plan = triton_impl.plan(group)
                slot = _Slot(plan)
                if not plan.copies:  # a plan with copies holds this call's bytes: never reused
                    self._keep(key, slot)
            triton_impl.run(slot.plan)  # zero, kernel, copy to pinned memory: queued; a CUDA graph once reused
            done = recorded_event()

        def read() -> bytes:
            done.synchronize()  # this launch only; releases the GIL while it waits
            try:
                return triton_impl.read_packed(slot.plan)
            finally:
                self._release(slot)

        return read


def _ready(packed: bytes) -> Callable[[], bytes]:
    return lambda: packed


def recorded_event() -> torch.cuda.Event:
    """An event recorded now on the current CUDA stream, for another thread to wait on. Blocking: the waiting
    thread sleeps until the GPU gets there, where a plain event's synchronize() busy-waits, so a recorder's
    writer, which waits for each step's results from the moment it is queued, would keep a CPU core spinning
    for most of every step."""
    import torch

    done = torch.cuda.Event(blocking=True)
    done.record()
    return done


def read_scalar(value: Any) -> Callable[[], float | None]:
    """A loss (tensor, number or None) as a float read later: a CUDA tensor is copied to pinned memory in
    its stream now, and read once the copy is done, so that recording never calls `.item()` on the GPU."""
    import torch

    if value is None:
        return lambda: None
    if not isinstance(value, torch.Tensor):
        number = float(value)
        return lambda: number
    if value.numel() != 1:
        raise ValueError(f"loss must be a scalar, got a tensor of shape {tuple(value.shape)}")
    if value.device.type != "cuda":
        number = float(value.detach().reshape(()).to(torch.float32).item())
        return lambda: number
    # As few calls into torch as it takes (each lets the writer thread take the GIL): the copy converts the dtype.
    host = torch.empty(value.shape, dtype=torch.float32, pin_memory=True)
    with torch.no_grad(), torch.cuda.device(value.device):
        host.copy_(value, non_blocking=True)
        done = recorded_event()

    def read() -> float:
        done.synchronize()
        return float(host.item())

    return read
