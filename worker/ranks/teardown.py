"""How a rank program leaves its process group: every rank done, then torn down so that no thread can wait forever.

torch stops a gloo group's worker threads, joining them, when the group's last reference goes, in the thread that
drops it. A worker frees the collectives it ran, and freeing one that holds Python state takes the GIL: tensors that
Python holds (those of `all_gather_object`, which a bisect's probe calls just before the final barrier), the context
that a backward keeps in thread-local state and every collective launched in it copies (DDP's gradient allreduce,
torch 2.13). The works that were in flight when a barrier was issued are freed with the barrier's own work, on a
worker, just after the barrier returns. DDP's reducer holds the group too, and pybind frees a reducer with the GIL
held: when the reducer was the last owner (the group destroyed, then the model freed as the training function
returned), the joining thread held the GIL that a worker freeing those works waited for, and the rank never exited
(bisect runs; the stacks: `~Reducer -> ~ProcessGroupGloo -> thread::join` against `runLoop -> ~AsyncWork ->
gil_scoped_acquire`).

The group's own Python object releases the GIL while it frees the group, so `leave` keeps it past every other
owner (DDP must be gone: call it after the function that built DDP has returned) and drops it last. (Under some
settings torch keeps references of its own to the group until the interpreter exits; the workers are long idle then.)
"""

from __future__ import annotations

import gc

import torch.distributed as dist


def leave() -> None:
    """Wait for every rank, then destroy the default process group with its last reference dropped by us, with the
    GIL released (see the module's docstring). Call it once the model and DDP are gone."""
    gc.collect()  # DDP and its reducer, if a reference cycle outlived the function that built them
    dist.barrier()  # every rank done before any tears down
    group = dist.group.WORLD
    dist.destroy_process_group()  # torch's references go (its registry's with the GIL held): ours outlives them
    del group  # the last reference: the group's worker threads are joined here, with the GIL released
