"""Runs a rank program with a gloo worker thread still busy in Python when the rank tears its process group down.

Usage: python busy_gloo.py -m MODULE ARGS...  or  python busy_gloo.py SCRIPT ARGS...  (in place of the program)

Every `dist.barrier()` first starts an allreduce whose completion callback keeps its gloo worker in Python for
HOLD_S, so a worker still needs the GIL after the final barrier has returned, as one does when it frees a collective
that holds Python state (detlab.worker.ranks.teardown), but every time instead of now and then. A rank that joins
the group's workers with the GIL held then never exits; one that drops the group's last reference with the GIL
released waits HOLD_S.
"""

from __future__ import annotations

import runpy
import sys
import time
from typing import Any

import torch
import torch.distributed as dist

HOLD_S = 2.0
_barrier = dist.barrier


def barrier(*args: Any, **kwargs: Any) -> Any:
    dist.all_reduce(torch.zeros(1), async_op=True).get_future().then(lambda _: time.sleep(HOLD_S))
    return _barrier(*args, **kwargs)


if __name__ == "__main__":
    dist.barrier = barrier
    if sys.argv[1] == "-m":
        sys.argv = sys.argv[2:]
        runpy.run_module(sys.argv[0], run_name="__main__", alter_sys=True)
    else:
        sys.argv = sys.argv[1:]
        runpy.run_path(sys.argv[0], run_name="__main__")
