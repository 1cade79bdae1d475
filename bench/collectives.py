"""What recording collective calls costs a DDP training step: the built-in `mlp` workload under DDP (gloo on CPU,
nccl on CUDA), interleaved blocks of steps: baseline DDP without a recorder; DDP with detlab.Recorder (the
parameters after each step); and DDP with detlab.Recorder(collectives=True) + rec.hook_ddp (also every bucket's
input and output). Median step time per mode with its quartiles, and each recorder's overhead on the baseline
and of the collectives on the plain recorder. On CPU every digest is computed at the call (torch-cpu).

    python bench/collectives.py [--ranks 2] [--rounds 6] [--block 20] [--device cpu|cuda]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel

import detlab
from detlab.worker.workloads import registry

MODES = ("baseline", "recorder", "collectives")


def quartiles(values: list[float]) -> tuple[float, float, float]:
    q = statistics.quantiles(values, n=4)
    return q[0], statistics.median(values), q[2]


def rank_main(rank: int, world: int, args: argparse.Namespace, port: int, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world))
    cuda = args.device == "cuda"
    device = torch.device("cuda", rank) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    torch.set_num_threads(1)
    dist.init_process_group("nccl" if cuda else "gloo", rank=rank, world_size=world)
    workload = registry()["mlp"]()
    share = workload.global_batch // world
    models = {}
    for mode in MODES:
        torch.manual_seed(0)
        model = workload.build().to(device)
        models[mode] = (DistributedDataParallel(model, device_ids=[rank] if cuda else None),
                        torch.optim.AdamW(model.parameters(), lr=1e-3))
    recorders = {"recorder": detlab.Recorder(out=Path(out) / "plain"),
                 "collectives": detlab.Recorder(out=Path(out) / "calls", collectives=True)}
    recorders["collectives"].hook_ddp(models["collectives"][0])
    times: dict[str, list[float]] = {mode: [] for mode in MODES}
    step = 0

    def one(mode: str) -> float:
        nonlocal step
        ddp, opt = models[mode]
        if cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        batch = tuple(t[rank * share:(rank + 1) * share] for t in workload.batch(step, 0, device))
        loss = workload.loss(ddp, batch)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if mode in recorders:
            recorders[mode].step(step, ddp, loss=loss)
        if cuda:
            torch.cuda.synchronize()
        step += 1
        return time.perf_counter() - t0

    for mode in times:  # warm-up
        for _ in range(3):
            one(mode)
    for _ in range(args.rounds):
        for mode in times:
            times[mode] += [one(mode) for _ in range(args.block)]
    for rec in recorders.values():
        rec.close()
    if rank == 0:
        found = {mode: quartiles(times[mode]) for mode in MODES}
        print(f"device {args.device}, {world} ranks, mlp, {args.rounds} rounds x {args.block} steps per mode")
        for mode, (lo, mid, hi) in found.items():
            print(f"{mode:12s} step {mid * 1e3:8.2f} ms (quartiles {lo * 1e3:.2f} .. {hi * 1e3:.2f})")
        base, plain, calls = (found[m][1] for m in MODES)
        print(f"recorder: {plain / base - 1:+.1%}, recorder with collectives: {calls / base - 1:+.1%} of the "
              f"baseline median step; the collectives alone: {calls / plain - 1:+.1%} of the recorder's")
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--block", type=int, default=20)
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    args = parser.parse_args()
    from detlab.worker.launch import free_port

    with tempfile.TemporaryDirectory() as out:
        mp.spawn(rank_main, args=(args.ranks, args, free_port(), out), nprocs=args.ranks)


if __name__ == "__main__":
    main()
