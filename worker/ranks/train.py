"""One rank of a `train` run, launched torchrun-style (RANK, LOCAL_RANK, WORLD_SIZE, MASTER_*).

Trains the workload under DDP and appends one JSON line per fact to its spool file:
`env` (RankEnv), `tensors` (index -> name, shape, dtype), `step` (digests, loss bits, step time).
The worker streams the spool to the ingest API, so whatever a crashed rank wrote is kept.

Usage: python -m detlab.worker.ranks.train SPEC.json
"""

from __future__ import annotations

import json
import os
import platform
import random
import struct
import sys
import time
from pathlib import Path
from typing import Any, TextIO

import numpy as np
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from detlab.core.configs import ENV_PREFIXES, ENV_VALIDATORS
from detlab.worker import fingerprint as fp
from detlab.worker.workloads import registry


def apply_torch_flags(flags: dict[str, bool]) -> None:
    torch.use_deterministic_algorithms(flags["deterministic_algorithms"])
    torch.backends.cudnn.deterministic = flags["cudnn_deterministic"]
    torch.backends.cudnn.benchmark = flags["cudnn_benchmark"]
    torch.backends.cuda.matmul.allow_tf32 = flags["allow_tf32"]
    torch.backends.cudnn.allow_tf32 = flags["allow_tf32"]


def effective_torch_flags() -> dict[str, Any]:
    """What torch reports at run time, to set beside what the config requested."""
    return {
        "deterministic_algorithms": torch.are_deterministic_algorithms_enabled(),
        "cudnn_deterministic": torch.backends.cudnn.deterministic,
        "cudnn_benchmark": torch.backends.cudnn.benchmark,
        "allow_tf32": torch.backends.cuda.matmul.allow_tf32 and torch.backends.cudnn.allow_tf32,
        "num_threads": torch.get_num_threads(),
    }


def effective_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k in ENV_VALIDATORS or k.startswith(ENV_PREFIXES)}


def rank_env(device: torch.device, backend: str) -> dict[str, Any]:
    cuda = device.type == "cuda"
    nccl = None
    if cuda and hasattr(torch.cuda, "nccl"):
        v = torch.cuda.nccl.version()
        nccl = ".".join(map(str, v)) if isinstance(v, tuple) else str(v)
    driver = None
    if cuda:
        try:
            import subprocess

            out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                 capture_output=True, text=True, timeout=10)
            driver = out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout.strip() else None
        except (OSError, subprocess.SubprocessError):
            driver = None
    return {
        "host": platform.node(),
        "device": torch.cuda.get_device_name(device) if cuda else f"cpu ({platform.processor() or platform.machine()})",
        "driver": driver,
        "cuda": torch.version.cuda if cuda else None,
        "hip": getattr(torch.version, "hip", None),
        "torch": torch.__version__,
        "nccl": nccl,
        "backend": backend,
        "effective_env": effective_env(),
        "torch_flags": effective_torch_flags(),
    }


def loss_bits(loss: torch.Tensor) -> str:
    return f"{struct.unpack('<I', struct.pack('<f', loss.detach().float().item()))[0]:08x}"


def flip_bit(model: torch.nn.Module, tensor_name: str) -> None:
    """Fault injection: flip the lowest bit of the first element (validates that detlab sees it)."""
    params = dict(model.named_parameters())
    if tensor_name not in params:
        raise ValueError(f"inject_bitflip: unknown tensor {tensor_name!r}; tensors: {sorted(params)}")
    with torch.no_grad():
        p = params[tensor_name]
        flat = p.detach().view(-1)
        if p.dtype == torch.float32:
            flat[:1].view(torch.int32).bitwise_xor_(1)
        else:
            flat[:1].add_(1)


class Spool:
    def __init__(self, path: Path) -> None:
        self._f: TextIO = path.open("a", buffering=1)

    def write(self, record: dict[str, Any]) -> None:
        self._f.write(json.dumps(record, separators=(",", ":")) + "\n")
        self._f.flush()


def pick_device(requested: str, local_rank: int) -> torch.device:
    if requested == "cpu" or (requested == "auto" and not torch.cuda.is_available()):
        return torch.device("cpu")
    if torch.cuda.device_count() <= local_rank:
        raise RuntimeError(f"local rank {local_rank} needs a GPU but only {torch.cuda.device_count()} are visible")
    torch.cuda.set_device(local_rank)
    return torch.device("cuda", local_rank)


def train(spec: dict[str, Any]) -> None:
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ.get("LOCAL_RANK", rank))
    if spec.get("threads"):
        torch.set_num_threads(int(spec["threads"]))
    apply_torch_flags(spec["torch"])
    seed = int(spec["seed"])
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    device = pick_device(spec.get("device", "auto"), local_rank)
    backend = "nccl" if device.type == "cuda" else "gloo"
    spool = Spool(Path(spec["spool_dir"]) / f"rank{rank}.jsonl")
    dist.init_process_group(backend, rank=rank, world_size=world)
    workload = registry()[spec["workload"]]()
    if workload.global_batch % world:
        raise ValueError(f"global batch {workload.global_batch} of {workload.name} does not split over {world} ranks")
    model = workload.build().to(device)
    ddp = DistributedDataParallel(model, device_ids=[local_rank] if device.type == "cuda" else None)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    named = list(model.named_parameters())
    spool.write({"type": "env", "rank": rank, "fingerprint_impl": fp.implementation_name(device),
                 **rank_env(device, backend)})
    if rank == 0:
        spool.write({"type": "tensors", "tensors": [
            {"index": i, "name": n, "shape": list(p.shape), "dtype": str(p.dtype).removeprefix("torch.")}
            for i, (n, p) in enumerate(named)]})
    inject = spec.get("inject_bitflip") or {}
    interval, steps = int(spec.get("fingerprint_interval", 1)), int(spec["steps"])
    share = workload.global_batch // world

    params = [p for _, p in named]  # one list, the same every step: the fingerprint's launch plan is kept

    def record(step: int, loss: torch.Tensor | None, seconds: float) -> None:
        digests = fp.fingerprint_many(params)
        packed = b"".join(fp.digest_to_bytes(d) for d in digests)
        spool.write({"type": "step", "step": step, "rank": rank, "fp_version": fp.FP_VERSION,
                     "model_digest": fp.fingerprint_bytes(packed), "digests": packed.hex(),
                     "loss_bits": loss_bits(loss) if loss is not None else "",
                     "loss": float(loss.item()) if loss is not None else None, "step_time_s": seconds})

    record(0, None, 0.0)
    for step in range(1, steps + 1):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
        t0 = time.perf_counter()
        batch = tuple(t[rank * share : (rank + 1) * share] for t in workload.batch(step, seed, device))
        loss = workload.loss(ddp, batch)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if device.type == "cuda":
            end.record()
            end.synchronize()
            seconds = start.elapsed_time(end) / 1e3
        else:
            seconds = time.perf_counter() - t0
        if inject and int(inject["step"]) == step and int(inject.get("rank", 0)) == rank:
            flip_bit(model, str(inject["tensor"]))
        if step % interval == 0 or step == steps:
            record(step, loss, seconds)
    dist.barrier()
    dist.destroy_process_group()


def main() -> None:
    spec = json.loads(Path(sys.argv[1]).read_text())
    train(spec)


if __name__ == "__main__":
    main()
