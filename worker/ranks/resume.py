"""One rank of a `resume` job's run: a built-in workload trained under DDP with an LR scheduler, recording per step
its parameters and optimizer state, the batch it read, the random generators' states and the optimizer's
hyperparameters (detlab.tensors.state), as detlab.Recorder(optimizer=..., rng=True) records them.

The straight run trains steps 1..N. The resumed run is launched twice: phase `stop` trains steps 1..K and writes a
checkpoint (model, optimizer, scheduler, random generators, data position) to `checkpoint_dir`; phase `continue`,
in fresh processes, restores it, records the restored state of step K (segment 1, `restored`), and trains K+1..N.
`lose` leaves one part out of the restore, for detlab to name.

Usage: python -m detlab.worker.ranks.train SPEC.json (a RankSpec with `resume`)
"""

from __future__ import annotations

import math
import os
import random
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from detlab.core.shards import ABSENT
from detlab.core.wire import RankSpec, StepRecord, StepState, TensorInfo, TensorsRecord
from detlab.tensors import fingerprint as fp
from detlab.tensors import state as train_state
from detlab.tensors.digests import Digester
from detlab.tensors.named import ModelTensors
from detlab.tensors.stack import apply_torch_flags, env_record
from detlab.worker.ranks.train import Spool, loss_bits, pick_device
from detlab.worker.workloads import registry

# AdamW's per-parameter state, keys sorted as detlab.tensors.named lists them: known before its first step, so that
# the tensors record (and step 0, before any state exists) can name it.
ADAMW_STATE: tuple[tuple[str, list[int] | None], ...] = (("exp_avg", None), ("exp_avg_sq", None), ("step", []))


def rng_snapshot() -> dict[str, Any]:
    state: dict[str, Any] = {"torch": torch.get_rng_state(), "numpy": np.random.get_state(),
                             "python": random.getstate()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def rng_restore(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    np.random.set_state(state["numpy"])
    random.setstate(state["python"])
    if "cuda" in state:
        torch.cuda.set_rng_state_all(state["cuda"])


def train(spec: RankSpec) -> None:
    plan = spec.resume
    assert plan is not None and spec.spool_dir is not None
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    if spec.threads:
        torch.set_num_threads(spec.threads)
    if spec.torch:
        apply_torch_flags(spec.torch)
    random.seed(spec.seed)
    np.random.seed(spec.seed)
    torch.manual_seed(spec.seed)
    device = pick_device(spec.device, int(os.environ.get("LOCAL_RANK", rank)))
    backend = "nccl" if device.type == "cuda" else "gloo"
    spool = Spool(Path(spec.spool_dir) / f"rank{rank}.jsonl")
    dist.init_process_group(backend, rank=rank, world_size=world)
    workload = registry()[spec.workload]()
    model = workload.build().to(device)
    ddp = DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=max(1, spec.steps // 4), gamma=0.5)
    tensors = ModelTensors(model)
    params = tensors.parameters()
    names = [n for n, _ in params] + [f"{n}.{key}" for n, _ in params for key, _ in ADAMW_STATE]
    shapes = [list(p.shape) for _, p in params] + [list(p.shape) if s is None else s
                                                   for _, p in params for _, s in ADAMW_STATE]
    dtypes = [str(p.dtype) for _, p in params] + [str(p.dtype) if s is None else "torch.float32"
                                                  for _, p in params for _, s in ADAMW_STATE]
    share = workload.global_batch // world
    digester = Digester()
    checkpoint = Path(plan.checkpoint_dir or spec.spool_dir) / f"rank{rank}.pt"
    segment, first, position = 0, 1, 1  # position: the index of the next batch the data yields

    def record(step: int, loss: torch.Tensor | None, batch: Any, seconds: float, restored: bool = False) -> None:
        state = tensors.optimizer_state(opt)
        by_name = dict(params + state)
        present = [by_name[n] for n in names if n in by_name]
        found = iter(fp.split_packed(digester.submit(present).packed()))
        packed = b"".join(next(found) if n in by_name else ABSENT for n in names)
        value = float(loss.item()) if loss is not None else None
        extra = StepState(batch=train_state.submit_batch(batch, digester)() if batch is not None else None,
                          rng=train_state.rng_states([], defaults=True),
                          optimizer=train_state.optimizer_entries(opt, {id(p): n for n, p in params}))
        spool.write(StepRecord(step=step, rank=rank, fp_version=fp.FP_VERSION,
                               model_digest=fp.fingerprint_bytes(packed), digests=packed.hex(),
                               loss_bits=loss_bits(loss) if loss is not None else "",
                               loss=value if value is not None and math.isfinite(value) else None,
                               step_time_s=seconds, state=extra, segment=segment, restored=restored))

    if plan.phase == "continue":  # a fresh process: restore the checkpoint, less what `lose` names
        saved = torch.load(checkpoint, weights_only=False)
        model.load_state_dict(saved["model"])
        if plan.lose != "optimizer":
            opt.load_state_dict(saved["optimizer"])
        if plan.lose != "scheduler":
            sched.load_state_dict(saved["scheduler"])
        if plan.lose != "rng":
            rng_restore(saved["rng"])
        position = 1 if plan.lose == "data" else saved["position"]  # a loader that starts its epoch again
        segment, first = 1, saved["step"] + 1
        record(saved["step"], None, None, 0.0, restored=True)
    else:
        spool.write(env_record(rank, device, backend).model_copy(update={"position": {"dp": rank}}))
        if rank == 0:
            spool.write(TensorsRecord(tensors=[
                TensorInfo(index=i, name=n, shape=s, dtype=d.removeprefix("torch."),
                           component="parameters" if i < len(params) else "optimizer")
                for i, (n, s, d) in enumerate(zip(names, shapes, dtypes, strict=True))]))
        record(0, None, None, 0.0)
    last = plan.stop_at if plan.phase == "stop" and plan.stop_at else spec.steps
    for step in range(first, last + 1):
        t0 = time.perf_counter()
        batch = tuple(t[rank * share : (rank + 1) * share] for t in workload.batch(position, spec.seed, device))
        position += 1
        loss = workload.loss(ddp, batch)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        sched.step()
        record(step, loss, batch, time.perf_counter() - t0)
    if plan.phase == "stop":
        checkpoint.parent.mkdir(parents=True, exist_ok=True)
        torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(), "scheduler": sched.state_dict(),
                    "rng": rng_snapshot(), "position": position, "step": last}, checkpoint)
