"""DDP over gloo under `torchrun --nproc-per-node N`, recorded with `detlab.Recorder(..., collectives=True)`:
every gradient bucket's allreduce (through `rec.hook_ddp`) and one Python-level `all_reduce(async_op=True)` of
the loss per step. Deterministic on CPU: seeded model and data, a fixed global batch split by data-parallel
position, one thread per rank.

Usage: python train_collectives.py OUT [--steps N] [--reversed-positions] [--plant STEP:RANK]
                                      [--reduce-order forward|reverse] [--no-collectives]

--no-collectives: the same loop recorded without collectives (no DDP hook: DDP's own C++ allreduce).

--reversed-positions: rank r takes data-parallel position N-1-r (its batch shard, and `position={"dp": ...}`),
    so that a run numbers its ranks the other way round from a plain run. Buffers are never broadcast: each
    rank's BatchNorm statistics are its own shard's, so ranks differ and a comparison by rank number would see it.
--plant STEP:RANK: on RANK at STEP, one bit (mantissa bit 12) of the first gradient element DDP hands to its
    bucket is flipped (a tensor hook on the last layer's weight: before the allreduce).
--reduce-order: a test-only stand-in for a reduction order: all_reduce is replaced, at the process-group
    level, by an all_gather followed by a sum of the ranks' tensors in rank order (forward) or the reverse order
    (reverse). Same inputs, a different association of the float sums: with 3 or more ranks, outputs can differ.
"""

from __future__ import annotations

import argparse
import datetime
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed import distributed_c10d as c10d
from torch.nn.parallel import DistributedDataParallel

import detlab

GLOBAL_BATCH = 24


class _Done:
    """The work of a collective that already ran (the ordered all_reduce is synchronous)."""

    def __init__(self, tensor: torch.Tensor) -> None:
        self._tensor = tensor

    def wait(self, timeout: Any = None) -> bool:
        return True

    def is_completed(self) -> bool:
        return True

    def get_future(self) -> torch.futures.Future:
        future: torch.futures.Future = torch.futures.Future()
        future.set_result([self._tensor])
        return future


def ordered_all_reduce(reverse: bool) -> Any:
    all_gather = c10d.all_gather

    def all_reduce(tensor: torch.Tensor, op: Any = dist.ReduceOp.SUM, group: Any = None,
                   async_op: bool = False) -> Any:
        parts = [torch.empty_like(tensor) for _ in range(dist.get_world_size(group))]
        all_gather(parts, tensor, group=group)
        order = parts[::-1] if reverse else parts
        total = order[0].clone()
        for part in order[1:]:
            total += part
        tensor.copy_(total)
        return _Done(tensor) if async_op else None

    return all_reduce


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--reversed-positions", action="store_true")
    parser.add_argument("--plant")
    parser.add_argument("--reduce-order", choices=["forward", "reverse"])
    parser.add_argument("--no-collectives", action="store_true")
    args = parser.parse_args()

    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    # A collective stuck past 120 s raises (gloo names it) instead of hanging the test to its own timeout.
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=120))
    rank, world = dist.get_rank(), dist.get_world_size()
    if args.reduce_order:
        c10d.all_reduce = dist.all_reduce = ordered_all_reduce(args.reduce_order == "reverse")
    dp = world - 1 - rank if args.reversed_positions else rank
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.BatchNorm1d(16), torch.nn.ReLU(),
                                torch.nn.Linear(16, 1))
    net = DistributedDataParallel(model, broadcast_buffers=False)  # rank-local BatchNorm statistics
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    plant_step, plant_rank = (int(x) for x in args.plant.split(":")) if args.plant else (-1, -1)
    state = {"step": -1}

    def plant(grad: torch.Tensor) -> torch.Tensor:
        if state["step"] == plant_step and rank == plant_rank:
            grad = grad.clone()
            grad.view(-1)[:1].view(torch.int32).bitwise_xor_(1 << 12)  # one mantissa bit, not rounded away
        return grad

    model[3].weight.register_hook(plant)
    with detlab.Recorder(out=args.out, buffers=True, collectives=not args.no_collectives,
                         position={"dp": dp}) as rec:
        if not args.no_collectives:
            rec.hook_ddp(net)
        share = GLOBAL_BATCH // world
        for step in range(args.steps):
            state["step"] = step
            data = torch.Generator().manual_seed(1000 + step)
            x = torch.randn(GLOBAL_BATCH, 8, generator=data)[dp * share : (dp + 1) * share]
            loss = torch.nn.functional.mse_loss(net(x), x.sum(dim=1, keepdim=True))
            opt.zero_grad()
            loss.backward()
            opt.step()
            total = loss.detach().clone()
            dist.all_reduce(total, async_op=True).wait()  # the global loss, as a loop would log it
            rec.step(step, net, loss=total / world)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
