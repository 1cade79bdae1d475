"""The one rank of a `batch-invariance` or `op-audit` run (detlab.worker.diagnose), launched like the others.

Applies the config's seed, threads and torch flags as a train rank does (before the model is built), then
appends `Record` lines to its spool: one `env` (its stack: device, TF32 and deterministic flags in effect),
then one `invariance` record per (op, dtype, batch size) and one `model-invariance` record per batch size,
or one `audit-op` record per aten op of one training step, each as soon as it is measured.

Usage: python -m detlab.worker.ranks.diagnose SPEC.json  (a RankSpec of kind batch-invariance or op-audit)
"""

from __future__ import annotations

import os
import random
import sys
from pathlib import Path

import numpy as np
import torch

from detlab.core.wire import RankSpec
from detlab.tensors.audit import audit_step
from detlab.tensors.batch_invariance import model_invariance, op_invariance
from detlab.tensors.stack import apply_torch_flags, env_record
from detlab.worker.ranks.train import Spool, pick_device
from detlab.worker.workloads import registry


def _seed(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def diagnose(spec: RankSpec) -> None:
    if spec.spool_dir is None or spec.diagnosis is None:
        raise ValueError("a diagnosis rank needs spool_dir and diagnosis in its spec")
    rank = int(os.environ.get("RANK", "0"))
    if spec.threads:
        torch.set_num_threads(spec.threads)
    if spec.torch:
        apply_torch_flags(spec.torch)
    _seed(spec.seed)
    device = pick_device(spec.device, int(os.environ.get("LOCAL_RANK", rank)))
    spool = Spool(Path(spec.spool_dir) / f"rank{rank}.jsonl")
    spool.write(env_record(rank, device, "none"))
    d = spec.diagnosis
    if spec.kind == "batch-invariance":
        for record in op_invariance(d.ops, d.dtypes, d.batch_sizes, d.features, device, spec.seed):
            spool.write(record)
        if d.workload:
            workload = registry()[d.workload]()
            model = workload.build().to(device)
            for model_record in model_invariance(workload, model, d.batch_sizes, device, spec.seed):
                spool.write(model_record)
        return
    workload = registry()[spec.workload]()
    model = workload.build().to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    batch = workload.batch(1, spec.seed, device)

    def step() -> None:
        loss = workload.loss(model, batch)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    for op_record in audit_step(step, d.reruns, d.calls_per_op):
        spool.write(op_record)


def main() -> None:
    diagnose(RankSpec.model_validate_json(Path(sys.argv[1]).read_text()))


if __name__ == "__main__":
    main()
