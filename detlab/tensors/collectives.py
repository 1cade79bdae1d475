"""Fingerprints of every collective call a training loop makes: its input before the call, its output after.

`CallTracer.install()` wraps the Python-level `torch.distributed` collectives (all_reduce, broadcast,
all_gather_into_tensor, reduce_scatter_tensor, all_gather, reduce_scatter, all_gather_single,
reduce_scatter_single; `async_op=True` included: the output
is read when the returned work is waited for) and `uninstall()` puts the originals back. DDP calls its process
group from C++, so DDP models are watched through a communication hook (`hook_ddp`) that fingerprints each
bucket's input and its allreduced output.

Digests are queued where the tensors live, through a Digester of its own (detlab.tensors.digests): on CUDA the
input's digest is queued on the current stream before the collective (which waits for that stream), the output's
after the collective's work is waited for, and both are read on the recorder's writer thread; there is no host
sync per call. What is not seen: collectives called through names bound before `install()` (`from
torch.distributed import all_reduce`), functional collectives (torch.compile, DTensor redistribution) and
calls made inside NCCL by other libraries.
"""

from __future__ import annotations

import inspect
import threading
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from detlab.core.wire import MAX_CALLS, CallInfo, CallsRecord

if TYPE_CHECKING:
    import torch

    from detlab.tensors.digests import Digester, Pending

# torch.distributed function -> (its input argument, its output argument); in-place ops name one argument twice.
WRAPPED: dict[str, tuple[str, str]] = {
    "all_reduce": ("tensor", "tensor"),
    "broadcast": ("tensor", "tensor"),
    "all_gather_into_tensor": ("input_tensor", "output_tensor"),
    "reduce_scatter_tensor": ("input", "output"),
    "all_gather": ("tensor", "tensor_list"),
    "reduce_scatter": ("input_list", "output"),
    # torch 2.13's names for the *_tensor pair (those call these: one call is recorded, by the name called)
    "all_gather_single": ("input_tensor", "output_tensor"),
    "reduce_scatter_single": ("input", "output"),
}
DDP_OP = "ddp_allreduce"


@dataclass(eq=False)
class Call:
    """One call: what it was, its input's digests (queued), its output's (queued once the output is ready)."""

    info: CallInfo
    inputs: Pending
    outputs: Pending | None = None
    taken: bool = False  # handed to a record: an output waited for later is not read (it stays `unread`)


def _tensors(value: Any) -> list[torch.Tensor]:
    return list(value) if isinstance(value, (list, tuple)) else [value]


def _one(packed: bytes) -> bytes:
    """A call's packed digest: its tensor's, or for a list of tensors the digest of their packed digests."""
    from detlab.tensors import fingerprint as fp

    if len(packed) == fp.DIGEST_BYTES:
        return packed
    return fp.digest_to_bytes(fp.fingerprint_bytes(packed))


class _Work:
    """The work of an `async_op=True` collective: its output is fingerprinted when it is waited for."""

    def __init__(self, work: Any, tracer: CallTracer, call: Call, outputs: list[torch.Tensor]) -> None:
        self._work, self._tracer, self._call, self._outputs = work, tracer, call, outputs

    def wait(self, *args: Any, **kwargs: Any) -> Any:
        done = self._work.wait(*args, **kwargs)
        if self._call.outputs is None:
            self._tracer.after(self._call, self._outputs)
        return done

    def __getattr__(self, name: str) -> Any:
        return getattr(self._work, name)


# Collective buffers (DDP's buckets, a loop's own) keep their storage from step to step: their launch plans are
# kept, one per buffer, as the parameters' are.
KEPT_BUFFERS = 256


class CallTracer:
    """Records the collective calls of one process, step by step (`take()` hands over a step's calls)."""

    def __init__(self, digester: Digester | None = None) -> None:
        from detlab.tensors.digests import Digester

        self._digester = digester or Digester(kept=KEPT_BUFFERS)
        self._calls: list[Call] = []
        self._lock = threading.Lock()  # DDP's hooks run on autograd and process-group threads
        self._inside = threading.local()  # a wrapped collective calling another is one call
        self._originals: dict[str, Callable[..., Any]] = {}
        self._warned = False
        self.active = False

    # ---- patching -----------------------------------------------------------------------------------

    def install(self) -> None:
        """Wrap the torch.distributed collectives (in torch.distributed and distributed_c10d)."""
        import torch.distributed as dist
        from torch.distributed import distributed_c10d as c10d

        if self._originals:
            return
        for name in WRAPPED:
            original = getattr(c10d, name, None)
            if original is None:  # an older torch
                continue
            self._originals[name] = original
            wrapper = self._wrap(name, original)
            for module in (dist, c10d):
                if getattr(module, name, None) is original:
                    setattr(module, name, wrapper)
        self.active = True

    def uninstall(self) -> None:
        """Put every wrapped function back (a DDP hook stays registered but records nothing more)."""
        import torch.distributed as dist
        from torch.distributed import distributed_c10d as c10d

        self.active = False
        for name, original in self._originals.items():
            for module in (dist, c10d):
                if getattr(getattr(module, name, None), "__wrapped__", None) is original:
                    setattr(module, name, original)
        self._originals.clear()

    def _wrap(self, name: str, original: Callable[..., Any]) -> Callable[..., Any]:
        signature = inspect.signature(original)
        in_name, out_name = WRAPPED[name]

        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if not self.active or getattr(self._inside, "on", False):
                return original(*args, **kwargs)
            bound = signature.bind(*args, **kwargs)
            outputs = _tensors(bound.arguments[out_name])
            call = self.before(name, _tensors(bound.arguments[in_name]), bound.arguments.get("group"))
            self._inside.on = True
            try:
                result = original(*args, **kwargs)
            finally:
                self._inside.on = False
            if call is None:
                return result
            if bound.arguments.get("async_op") and result is not None:
                return _Work(result, self, call, outputs)
            self.after(call, outputs)
            return result

        wrapper.__wrapped__ = original  # type: ignore[attr-defined]
        wrapper.__name__ = name
        wrapper.__doc__ = original.__doc__
        return wrapper

    # ---- recording ----------------------------------------------------------------------------------

    def before(self, op: str, inputs: Sequence[torch.Tensor], group: Any) -> Call | None:
        """Queue the input's digest and note the call (None: this rank is not in the group, nothing is done)."""
        import torch.distributed as dist

        size = dist.get_world_size(group)
        if size < 1:
            return None
        info = CallInfo(op=op, dtype=str(inputs[0].dtype).removeprefix("torch."),
                        count=sum(t.numel() for t in inputs), group_size=size)
        call = Call(info, self._digester.submit(list(inputs)))
        with self._lock:
            if len(self._calls) >= MAX_CALLS:
                if not self._warned:
                    warnings.warn(f"detlab: more than {MAX_CALLS} collective calls in one step; the rest of the "
                                  "step's calls are not recorded", RuntimeWarning, stacklevel=3)
                    self._warned = True
                return None
            self._calls.append(call)
        return call

    def after(self, call: Call, outputs: Sequence[torch.Tensor]) -> None:
        """Queue the output's digest (the output is ready: the call returned, or its work was waited for)."""
        with self._lock:
            if not call.taken:
                call.outputs = self._digester.submit(list(outputs))

    def take(self) -> list[Call]:
        """The calls made since the last take(), in call order."""
        with self._lock:
            calls, self._calls = self._calls, []
            for call in calls:
                call.taken = True
        return calls

    def hook_ddp(self, model: torch.nn.Module) -> None:
        """Register a DDP communication hook that records each bucket's allreduce: the same arithmetic as
        torch's default `allreduce_hook` (the bucket divided by the group's size, then summed over it)."""
        from torch.nn.parallel import DistributedDataParallel

        if not isinstance(model, DistributedDataParallel):
            raise TypeError(f"hook_ddp takes a DistributedDataParallel model, got {type(model).__name__}")
        # DDP checks the hook's annotations at run time (this module's are strings): a plain function has none.
        def hook(state, bucket):  # type: ignore[no-untyped-def]
            return self._ddp_hook(state, bucket)

        model.register_comm_hook(state=model.process_group, hook=hook)

    def _ddp_hook(self, group: Any, bucket: Any) -> torch.futures.Future[torch.Tensor]:
        import torch.distributed as dist

        all_reduce = self._originals.get("all_reduce", dist.distributed_c10d.all_reduce)
        buffer = bucket.buffer()
        buffer.div_(dist.get_world_size(group))
        call = self.before(DDP_OP, [buffer], group) if self.active else None
        future = all_reduce(buffer, group=group, async_op=True).get_future()

        def done(fut: torch.futures.Future[Any]) -> torch.Tensor:
            if call is not None:
                self.after(call, [buffer])
            return fut.value()[0]

        return future.then(done)


def calls_record(step: int, rank: int, calls: list[Call]) -> CallsRecord:
    """A step's calls as one `calls` record (waits for their digests: call it on the writer thread)."""
    from detlab.tensors import fingerprint as fp

    inputs, outputs, unread = [], [], []
    for seq, call in enumerate(calls):
        inputs.append(_one(call.inputs.packed()))
        if call.outputs is None:
            unread.append(seq)
            outputs.append(bytes(16))
        else:
            outputs.append(_one(call.outputs.packed()))
    return CallsRecord(step=step, rank=rank, fp_version=fp.FP_VERSION, calls=[c.info for c in calls],
                       inputs=b"".join(inputs).hex(), outputs=b"".join(outputs).hex(), unread=unread)
