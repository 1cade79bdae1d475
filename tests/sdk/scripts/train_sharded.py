"""A sharded model trained with torch.distributed on CPU (gloo), recorded with detlab.Recorder: under
`torchrun --nproc-per-node N`. Deterministic: seeded model and data, one thread per rank.

Usage: python train_sharded.py OUT [--layout fsdp|fsdp-dim1|replicate] [--steps N] [--grads] [--optimizer-state]

  fsdp       FSDP2 (`fully_shard`) on a 1-D mesh of every rank: each parameter is Shard(0) over the ranks
  fsdp-dim1  the same, but fc1.weight sharded along dim 1 (another layout of the same model)
  replicate  every parameter a Replicate() DTensor (`distribute_module`); every rank trains on the whole batch

For the tests only: DETLAB_TEST_FLIP=STEP:RANK:TENSOR moves the first element of RANK's local shard of
TENSOR by one ulp after the optimizer step of STEP.
"""

from __future__ import annotations

import argparse
import os

import torch
import torch.distributed as dist
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_module, distribute_tensor, init_device_mesh

import detlab

GLOBAL_BATCH = 16


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--layout", choices=["fsdp", "fsdp-dim1", "replicate"], default="fsdp")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--grads", action="store_true")
    parser.add_argument("--optimizer-state", action="store_true")
    args = parser.parse_args()

    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    mesh = init_device_mesh("cpu", (world,))
    torch.manual_seed(0)
    # 15 rows: uneven shards (rank 0 holds 8 rows of fc1, rank 1 holds 7)
    layers = torch.nn.Sequential(torch.nn.Linear(8, 15), torch.nn.ReLU(), torch.nn.Linear(15, 1))
    model: torch.nn.Module = layers
    share = GLOBAL_BATCH // world
    if args.layout == "replicate":
        model = distribute_module(
            layers, mesh, input_fn=lambda _m, xs, m: tuple(distribute_tensor(x, m, [Replicate()]) for x in xs),  # type: ignore[arg-type]
            output_fn=lambda _m, out, _mesh: out.to_local())
        share = GLOBAL_BATCH  # every rank computes the whole batch: nothing to average
    else:
        # FSDP2 shards unevenly along dim 0 only: fc1.weight (15 x 8) goes along dim 1 in fsdp-dim1
        placement = ((lambda p: Shard(1) if p.ndim == 2 and p.shape[1] % world == 0 else Shard(0))
                     if args.layout == "fsdp-dim1" else None)
        for layer in (layers[0], layers[2], layers):
            fully_shard(layer, mesh=mesh, shard_placement_fn=placement)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    fault = os.environ.get("DETLAB_TEST_FLIP")
    flip_step, flip_rank, flip_name = (fault.split(":") if fault else ("-1", "-1", ""))
    params = dict(model.named_parameters())

    rec = detlab.Recorder(out=args.out, grads=args.grads, optimizer=opt if args.optimizer_state else None)
    for step in range(args.steps):
        data = torch.Generator().manual_seed(1000 + step)
        x = torch.randn(GLOBAL_BATCH, 8, generator=data)
        x = x if share == GLOBAL_BATCH else x[rank * share : (rank + 1) * share]
        loss = torch.nn.functional.mse_loss(model(x), x.sum(dim=1, keepdim=True))
        opt.zero_grad()
        loss.backward()
        if args.grads:
            rec.grads(step, model)
        opt.step()
        if step == int(flip_step) and rank == int(flip_rank):
            with torch.no_grad():
                target = params[flip_name]
                first = (target.to_local() if isinstance(target, DTensor) else target).view(-1)[:1]
                first.copy_(torch.nextafter(first, torch.full_like(first, float("inf"))))
        rec.step(step, model, loss=loss)
    rec.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
