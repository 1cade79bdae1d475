"""One rank of a `train` run, launched torchrun-style (RANK, LOCAL_RANK, WORLD_SIZE, MASTER_*).

Trains the workload under DDP and appends one `Record` line (detlab.core.wire) per fact to its spool
file: `env` (its stack), `tensors` (index -> name, shape, dtype), `step` (digests, loss bits, step time).
The worker streams the spool to the ingest API, so whatever a crashed rank wrote is kept.

Usage: python -m detlab.worker.ranks.train SPEC.json  (a RankSpec)
"""

from __future__ import annotations

import math
import os
import random
import struct
import sys
import time
from pathlib import Path
from typing import TextIO

import numpy as np
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from detlab.core.runs import recorded_steps
from detlab.core.wire import Drift, RankSpec, Record, StepRecord, TensorInfo, TensorsRecord
from detlab.tensors import fingerprint as fp
from detlab.tensors.drift import Sketcher
from detlab.tensors.probe import Probe
from detlab.tensors.stack import apply_torch_flags, env_record
from detlab.worker.ranks import teardown
from detlab.worker.workloads import registry


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


def drift_of(found: tuple[bytes, bytes] | None) -> Drift | None:
    """The step record's drift data from detlab.tensors.drift's (stats, sketch); None where there is none."""
    return Drift(stats=found[0].hex(), sketch=found[1].hex()) if found is not None else None


class Spool:
    """A rank's spool file: one Record as JSON per line, flushed as written."""

    def __init__(self, path: Path) -> None:
        self._f: TextIO = path.open("a", buffering=1)

    def write(self, record: Record) -> None:
        self._f.write(record.model_dump_json() + "\n")
        self._f.flush()


def pick_device(requested: str, local_rank: int) -> torch.device:
    if requested == "cpu" or (requested == "auto" and not torch.cuda.is_available()):
        return torch.device("cpu")
    if torch.cuda.device_count() <= local_rank:
        raise RuntimeError(f"local rank {local_rank} needs a GPU but only {torch.cuda.device_count()} are visible")
    torch.cuda.set_device(local_rank)
    return torch.device("cuda", local_rank)


def train(spec: RankSpec) -> None:
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ.get("LOCAL_RANK", rank))
    if spec.spool_dir is None:
        raise ValueError("a train rank needs spool_dir in its spec")
    if spec.threads:
        torch.set_num_threads(spec.threads)
    if spec.torch:
        apply_torch_flags(spec.torch)
    seed = spec.seed
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    device = pick_device(spec.device, local_rank)
    backend = "nccl" if device.type == "cuda" else "gloo"
    spool = Spool(Path(spec.spool_dir) / f"rank{rank}.jsonl")
    dist.init_process_group(backend, rank=rank, world_size=world)
    workload = registry()[spec.workload]()
    if workload.global_batch % world:
        raise ValueError(f"global batch {workload.global_batch} of {workload.name} does not split over {world} ranks")
    model = workload.build().to(device)
    ddp = DistributedDataParallel(model, device_ids=[local_rank] if device.type == "cuda" else None)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    named = list(model.named_parameters())
    tracer = None
    if spec.record_collectives:  # every gradient bucket's allreduce, and any collective the workload calls
        from detlab.tensors.collectives import CallTracer

        tracer = CallTracer()
        tracer.install()
        tracer.hook_ddp(ddp)
    # DDP replicates the whole model: a rank's logical position is its data-parallel index.
    spool.write(env_record(rank, device, backend).model_copy(update={"position": {"dp": rank}}))
    probing = spec.probe_step is not None  # a bisect run: its tensor list is its probe's entries (Probe.records)
    if rank == 0 and not probing:
        spool.write(TensorsRecord(tensors=[
            TensorInfo(index=i, name=n, shape=list(p.shape), dtype=str(p.dtype).removeprefix("torch."))
            for i, (n, p) in enumerate(named)]))
    inject = spec.inject_bitflip
    steps = spec.steps
    # A bisect run records every step before its probe step by its model digest alone (the replay is checked to
    # match up to there, and its progress shows), and the probe step module call by module call.
    fingerprinted = set(range(spec.probe_step) if spec.probe_step else recorded_steps(steps, spec.fingerprint_interval))
    share = workload.global_batch // world

    params = [p for _, p in named]  # one list, the same every step: the fingerprint's launch plan is kept
    sketcher = Sketcher()

    def record(step: int, loss: torch.Tensor | None, seconds: float) -> None:
        sketched = None if probing else sketcher.submit(params)  # a probe's steps before its own: digest only
        digests = fp.fingerprint_many(params)
        packed = fp.digests_to_bytes(digests)
        value = float(loss.item()) if loss is not None else None
        spool.write(StepRecord(step=step, rank=rank, fp_version=fp.FP_VERSION,
                               model_digest=fp.fingerprint_bytes(packed), digests="" if probing else packed.hex(),
                               loss_bits=loss_bits(loss) if loss is not None else "",
                               # a loss that blew up is kept in its bits; the number column takes finite ones
                               loss=value if value is not None and math.isfinite(value) else None,
                               step_time_s=seconds, drift=drift_of(sketched()) if sketched else None))

    record(0, None, 0.0)
    for step in range(1, steps + 1):
        probe = Probe(model) if step == spec.probe_step else None
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
        t0 = time.perf_counter()
        batch = tuple(t[rank * share : (rank + 1) * share] for t in workload.batch(step, seed, device))
        loss = workload.loss(ddp, batch)
        if probe:
            probe.loss(loss)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        if probe:
            probe.grads(named)
        opt.step()
        if device.type == "cuda":
            end.record()
            end.synchronize()
            seconds = start.elapsed_time(end) / 1e3
        else:
            seconds = time.perf_counter() - t0
        if inject and inject.step == step and inject.rank == rank:
            flip_bit(model, inject.tensor)
        if step in fingerprinted:
            record(step, loss, seconds)
        if tracer is not None and (calls := tracer.take()) and step in fingerprinted:
            from detlab.tensors.collectives import calls_record

            spool.write(calls_record(step, rank, calls))
        if probe:
            probe.params(named)
            tensors, stepped = probe.records(step, rank, float(loss.item()), loss_bits(loss), seconds)
            if rank == 0:
                spool.write(tensors)
            spool.write(stepped)
            break
    if tracer is not None:
        tracer.uninstall()


def main() -> None:
    spec = RankSpec.model_validate_json(Path(sys.argv[1]).read_text())
    if spec.resume is not None:  # a run of a resume job: the same training, checkpointed and restored
        from detlab.worker.ranks import resume

        resume.train(spec)
    else:
        train(spec)
    teardown.leave()  # once train's frame, with DDP and its reducer, is gone (worker/ranks/teardown.py)


if __name__ == "__main__":
    main()
