"""A plain-PyTorch training script that uses only what docs/sdk.md shows: one process, or DDP over gloo
under `torchrun --nproc-per-node N`. Deterministic on CPU: seeded model and data, a fixed global batch
split over the ranks, one thread per rank.

Usage: python train.py OUT [--steps N] [--every N] [--names GLOB ...] [--grads] [--buffers] [--optimizer-state]
                      [--server URL] [--name NAME] [--hold STEP:FILE ...] [--drift N | --no-drift]

OUT "-" with --server: no directory of our choosing (the recorder's spool dir). --hold STEP:FILE: before step
STEP, wait until FILE exists, so that a test can stop the server mid-run and know the run is still going.

For the tests only: DETLAB_TEST_FLIP=STEP:RANK:TENSOR moves one element of TENSOR (a parameter, or with
`.grad` its gradient before the optimizer step, or a buffer) by one ulp on RANK at STEP.
"""

from __future__ import annotations

import argparse
import gc
import os
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

import detlab

GLOBAL_BATCH = 16


def flip(tensor: torch.Tensor) -> None:
    with torch.no_grad():
        first = tensor.view(-1)[:1]
        first.copy_(torch.nextafter(first, torch.full_like(first, float("inf"))))


def main() -> dist.ProcessGroup | None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--every", type=int, default=1)
    parser.add_argument("--names", nargs="*")
    parser.add_argument("--grads", action="store_true")
    parser.add_argument("--buffers", action="store_true")
    parser.add_argument("--optimizer-state", action="store_true")
    parser.add_argument("--server")
    parser.add_argument("--name")
    parser.add_argument("--hold", action="append", default=[], metavar="STEP:FILE")
    parser.add_argument("--tags", nargs="*", default=[])
    parser.add_argument("--drift", type=int, default=1)  # every step: these runs are a few steps long
    parser.add_argument("--no-drift", dest="drift", action="store_const", const=0)
    args = parser.parse_args()

    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world > 1:
        dist.init_process_group("gloo")
    rank = dist.get_rank() if world > 1 else 0
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.BatchNorm1d(16), torch.nn.ReLU(),
                                torch.nn.Linear(16, 1))
    net = DistributedDataParallel(model) if world > 1 else model
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    fault = os.environ.get("DETLAB_TEST_FLIP")
    flip_step, flip_rank, flip_name = (fault.split(":") if fault else ("-1", "-1", ""))
    state = {**dict(model.named_parameters()), **dict(model.named_buffers())}

    rec = detlab.Recorder(out=None if args.out == "-" else args.out, server=args.server, name=args.name,
                          tags=args.tags, every=args.every, names=args.names, grads=args.grads, buffers=args.buffers,
                          optimizer=opt if args.optimizer_state else None, drift=args.drift)
    share = GLOBAL_BATCH // world
    holds = {int(step): Path(file) for step, file in (h.split(":", 1) for h in args.hold)}
    for step in range(args.steps):
        if step in holds:
            deadline = time.monotonic() + 300
            while not holds[step].exists():
                assert time.monotonic() < deadline, f"{holds[step]} did not appear in 300 s"
                time.sleep(0.05)
        data = torch.Generator().manual_seed(1000 + step)
        x = torch.randn(GLOBAL_BATCH, 8, generator=data)[rank * share : (rank + 1) * share]
        y = x.sum(dim=1, keepdim=True)
        loss = torch.nn.functional.mse_loss(net(x), y)
        opt.zero_grad()
        loss.backward()
        here = step == int(flip_step) and rank == int(flip_rank)
        if here and flip_name.endswith(".grad"):
            flip(state[flip_name.removesuffix(".grad")].grad)
        if args.grads:
            rec.grads(step, net)
        opt.step()
        if here and not flip_name.endswith(".grad"):
            flip(state[flip_name])
        rec.step(step, net, loss=loss)
    rec.close()
    if world > 1:
        dist.barrier()  # every rank done before any tears down
        group = dist.group.WORLD
        dist.destroy_process_group()
        return group
    return None


if __name__ == "__main__":
    # The group outlives the model: torch joins gloo's worker threads when its last reference goes, and DDP's reducer,
    # freed with the GIL held, must not be that reference while a worker frees a collective that holds Python state
    # (a hang at exit, seen in bisect runs: worker/ranks/teardown.py). The group's own object frees it without the GIL.
    group = main()
    gc.collect()  # the model and DDP, if a reference cycle outlived main
    del group
