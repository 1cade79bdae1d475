"""GPU smoke of the rank programs without a server: one train run and one collective run on every
visible GPU (nccl), launched as the worker launches them, every spooled record parsed as the wire
contract. Prints one JSON object: devices, records per type, fingerprint implementation, and the
collective summary's reproducibility.

    python bench/gpu_ranks.py [--workload tiny-lm] [--steps 20]
"""

from __future__ import annotations

import argparse
import json
import tempfile
from collections import Counter
from pathlib import Path

import torch

from detlab.core.collective import summarize
from detlab.core.wire import CollectiveSpec, RankSpec, Record
from detlab.worker.launch import launch_ranks


def run(spec: RankSpec) -> list[Record]:
    records: list[Record] = []
    with tempfile.TemporaryDirectory(prefix="detlab-gpu-") as tmp:
        launch_ranks(spec, Path(tmp), on_records=records.extend, timeout_s=600)
    return records


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", default="tiny-lm")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda", help="cpu: a gloo check of this script")
    args = parser.parse_args()
    world = max(torch.cuda.device_count(), 1) if args.device == "cuda" else 2
    base = {"seed": 0, "world_size": world, "device": args.device}
    train = run(RankSpec.model_validate({**base, "kind": "train", "workload": args.workload, "steps": args.steps,
                                         "torch": {"deterministic_algorithms": True, "cudnn_deterministic": True,
                                                   "cudnn_benchmark": False, "allow_tf32": False}}))
    sizes = [1 << 12, 1 << 20, 1 << 26]
    collective = CollectiveSpec(ops=["all_reduce_sum", "all_gather"], dtypes=["float32", "bfloat16"], sizes=sizes,
                                trials=5, warmup=2)
    trials = run(RankSpec.model_validate({**base, "kind": "collective", "workload": "collective",
                                          "steps": collective.cells(), "collective": collective}))
    envs = [r for r in train if r.type == "env"]
    summary = summarize([r.model_dump() for r in trials if r.type == "trial"], world)
    print(json.dumps({
        "world_size": world,
        "devices": sorted({e.device or "" for e in envs}),
        "nccl": sorted({e.nccl or "" for e in envs}),
        "fingerprint_impl": sorted({e.fingerprint_impl or "" for e in envs}),
        "train_records": Counter(r.type for r in train),
        "train_steps": sorted({r.step for r in train if r.type == "step"}),
        "collective_records": Counter(r.type for r in trials),
        "collective_cells": [{k: c[k] for k in ("op", "dtype", "bytes", "distinct_digests", "reproducible",
                                               "busbw_gbs")} for c in summary],
    }))


if __name__ == "__main__":
    main()
