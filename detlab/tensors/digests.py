"""Digests of a tensor list queued now and read later, so that recording does not wait for the GPU.

Why this is correct: a tensor must be read before anything changes it. On CUDA (where the Triton kernel
passed its self-check) one launch per device hashes the whole list, queued on that device's *current
stream* at the moment of the call; the loop's later work on that stream (the optimizer's next step) is
queued after it, so the kernel reads exactly the bytes the caller saw. The lane sums are copied to pinned
host memory in the same stream and a CUDA event is recorded; `Pending.result()` (called from the
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

# Distinct tensor lists whose launch plans are kept (parameters keep their storage from step to step;
# gradients set to None are usually reallocated at the same addresses).
KEPT_LISTS = 8


@dataclass(eq=False)
class _Slot:
    """One launch plan and whether a queued launch of it still awaits its result."""

    plan: Any  # detlab.tensors.fingerprint.triton_impl.Plan
    busy: bool = True


class Pending:
    """Digests of one list, in its order; `result()` blocks until they are all on the host."""

    def __init__(self, n: int) -> None:
        self._n = n
        self._parts: list[tuple[list[int], Callable[[], list[str]]]] = []

    def add(self, indices: list[int], read: Callable[[], list[str]]) -> None:
        """The digests of the tensors at `indices`, in that order, as `read()` will return them."""
        self._parts.append((indices, read))

    def result(self) -> list[str]:
        """Every digest, in the list's order (waits for the GPU where it must)."""
        out: list[str] = [""] * self._n
        for indices, read in self._parts:
            for i, digest in zip(indices, read(), strict=True):
                out[i] = digest
        return out


def _key(tensors: Sequence[torch.Tensor]) -> tuple:
    # What a Triton plan depends on: where the bytes lie, how many, and whether they are read in place.
    import torch

    T = torch.Tensor
    return (tuple(map(T.data_ptr, tensors)), tuple(t.nbytes for t in tensors), tuple(map(T.is_contiguous, tensors)),
            tuple(map(T.is_conj, tensors)), tuple(map(T.is_neg, tensors)))  # fmt: skip


class Digester:
    """Queues digests (the current version) of tensor lists; keeps Triton launch plans per list between calls."""

    def __init__(self, kept: int = KEPT_LISTS) -> None:
        self._kept = kept  # distinct tensor lists whose launch plans are kept
        self._plans: OrderedDict[tuple, list[_Slot]] = OrderedDict()
        self._lock = threading.Lock()  # `busy` is cleared by the thread that reads a result

    def submit(self, tensors: Sequence[torch.Tensor]) -> Pending:
        """Queue the digests of `tensors` (read as they are now); the result may be read from any thread."""
        from detlab.tensors import fingerprint as fp
        from detlab.tensors.named import local

        tensors = local(tensors)
        pending = Pending(len(tensors))
        by_device: dict[Any, list[int]] = {}
        for i, t in enumerate(tensors):
            by_device.setdefault(t.device, []).append(i)
        for device, idx in by_device.items():
            group = [tensors[i] for i in idx]
            if device.type == "cuda" and fp.implementation_name(device) == "triton":
                pending.add(idx, self._launch(device, group))
            else:
                pending.add(idx, _ready(fp.fingerprint_many(group)))
        return pending

    def _slot(self, key: tuple) -> _Slot | None:
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

    def _keep(self, key: tuple, slot: _Slot) -> None:
        with self._lock:
            self._plans.setdefault(key, []).append(slot)
            self._plans.move_to_end(key)
            while len(self._plans) > self._kept:
                self._plans.popitem(last=False)

    def _release(self, slot: _Slot) -> None:
        with self._lock:
            slot.busy = False

    def _launch(self, device: torch.device, group: list[torch.Tensor]) -> Callable[[], list[str]]:
        import torch

        from detlab.tensors.fingerprint import triton_impl

        key = (device, _key(group))
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

        def read() -> list[str]:
            done.synchronize()  # this launch only; releases the GIL while it waits
            try:
                return triton_impl.read_digests(slot.plan)
            finally:
                self._release(slot)

        return read


def _ready(digests: list[str]) -> Callable[[], list[str]]:
    return lambda: digests


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
    src = value.detach().reshape(()).to(torch.float32)
    if src.device.type != "cuda":
        number = float(src.item())
        return lambda: number
    host = torch.empty((), dtype=torch.float32, pin_memory=True)
    with torch.cuda.device(src.device):
        host.copy_(src, non_blocking=True)
        done = recorded_event()

    def read() -> float:
        done.synchronize()
        return float(host.item())

    return read
