"""What forking ranks from the zygote saves: a job's runs (configs × repeats of a train workload) launched as the
worker launches them, with ranks forked from the zygote against ranks started as fresh processes
(DETLAB_FORK_RANKS=0, as before the zygote), and against the same training as bare scripts (no detlab; issue 23's
time to verdict is the job's time over theirs).

One process per mode, `--rounds` of each, interleaved (fork, fresh, bare, fork ...). Each process runs the whole
job in turn and reports its wall time, the zygote's start (the first run of a worker pays it once) and every run's
step digests: the deterministic config's runs must have the same digests in both modes. Prints one line per
process and a JSON summary with medians and spreads.

    python bench/fork_ranks.py [--workload tiny-lm] [--steps 10] [--repeats 3] [--rounds 3] [--device cuda]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CONFIGS = {"default": ({}, {}),
           "deterministic": ({"deterministic_algorithms": True, "cudnn_deterministic": True, "cudnn_benchmark": False},
                             {"CUBLAS_WORKSPACE_CONFIG": ":4096:8"})}


# The same training as the train rank program (worker/ranks/train.py) with nothing of detlab's around it: what the
# team would run as its own scripts, one fresh process per rank.
BARE = """
import os, random, sys
import numpy as np, torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from detlab.core.wire import RankSpec
from detlab.tensors.stack import apply_torch_flags
from detlab.worker.workloads import registry
spec = RankSpec.model_validate_json(sys.argv[1])
rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
if spec.torch:
    apply_torch_flags(spec.torch)
random.seed(spec.seed); np.random.seed(spec.seed); torch.manual_seed(spec.seed)
device = torch.device("cuda", rank) if spec.device == "cuda" else torch.device("cpu")
if device.type == "cuda":
    torch.cuda.set_device(device)
dist.init_process_group("nccl" if device.type == "cuda" else "gloo", rank=rank, world_size=world)
workload = registry()[spec.workload]()
model = workload.build().to(device)
ddp = DistributedDataParallel(model, device_ids=[rank] if device.type == "cuda" else None)
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
share = workload.global_batch // world
for step in range(1, spec.steps + 1):
    batch = tuple(t[rank * share : (rank + 1) * share] for t in workload.batch(step, spec.seed, device))
    loss = workload.loss(ddp, batch)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
float(loss.item())
dist.destroy_process_group()
"""


def bare_job(workload: str, steps: int, repeats: int, device: str) -> dict[str, object]:
    """In this process: the job's runs as bare scripts, each rank a fresh process, one run after another."""
    import torch

    from detlab.core.wire import RankSpec
    from detlab.worker.launch import free_port, torchrun_env

    world = max(torch.cuda.device_count(), 1) if device == "cuda" else 2
    started = time.perf_counter()
    for flags, env in CONFIGS.values():
        spec = RankSpec.model_validate({"kind": "train", "workload": workload, "steps": steps, "seed": 0,
                                        "world_size": world, "device": device, **({"torch": flags} if flags else {})})
        for _ in range(repeats):
            port = free_port()
            ranks = [subprocess.Popen([sys.executable, "-c", BARE, spec.model_dump_json()],
                                      env=torchrun_env({**os.environ, **env}, rank, world, port, None))
                     for rank in range(world)]
            if any(r.wait() for r in ranks):
                raise RuntimeError("a bare rank failed")
    return {"job_s": time.perf_counter() - started, "zygote_s": 0.0, "world_size": world}


def job(workload: str, steps: int, repeats: int, device: str) -> dict[str, object]:
    """In this process: every config's repeats, one launch each; wall times and digests."""
    import torch

    from detlab.core.wire import RankSpec, StepRecord
    from detlab.worker import launch, zygote

    world = max(torch.cuda.device_count(), 1) if device == "cuda" else 2
    started = time.perf_counter()
    forks = zygote.shared(launch.PRELOADED)
    zygote_s = time.perf_counter() - started
    digests: dict[str, list[list[str]]] = {}
    for name, (flags, env) in CONFIGS.items():
        spec = RankSpec.model_validate({"kind": "train", "workload": workload, "steps": steps, "seed": 0,
                                        "world_size": world, "device": device, **({"torch": flags} if flags else {})})
        for _ in range(repeats):
            records: list[object] = []
            with tempfile.TemporaryDirectory() as tmp:
                launch.launch_ranks(spec, Path(tmp), env=lambda _rank, env=env: {**os.environ, **env},
                                    on_records=records.extend, timeout_s=600, forks=forks)
            digests.setdefault(name, []).append(sorted(f"{r.step}/{r.rank}/{r.model_digest}" for r in records
                                                       if isinstance(r, StepRecord)))
    return {"job_s": time.perf_counter() - started, "zygote_s": zygote_s if forks else 0.0,
            "forked": forks is not None and len(forks.exits) > 0, "world_size": world, "digests": digests}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", default="tiny-lm")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    parser.add_argument("--one", choices=["fork", "fresh", "bare"], help=argparse.SUPPRESS)  # a measuring process
    args = parser.parse_args()
    if args.one:
        measure = bare_job if args.one == "bare" else job
        print(json.dumps(measure(args.workload, args.steps, args.repeats, args.device)))
        return
    results: dict[str, list[dict[str, object]]] = {"fork": [], "fresh": [], "bare": []}
    for _ in range(args.rounds):
        for mode in results:
            env = {**os.environ, "DETLAB_FORK_RANKS": "1" if mode == "fork" else "0"}
            out = subprocess.run([sys.executable, __file__, "--one", mode, "--workload", args.workload,
                                  "--steps", str(args.steps), "--repeats", str(args.repeats), "--device", args.device],
                                 env=env, check=True, capture_output=True, text=True).stdout
            result = json.loads(out.splitlines()[-1])
            results[mode].append(result)
            print(mode, f"job {result['job_s']:.2f} s", f"zygote start {result['zygote_s']:.2f} s", flush=True)
    # The deterministic config's runs must all be alike, whichever way their ranks started; the default config's
    # repeats may part on a GPU (that is what detlab finds), so they are only reported.
    recorded = {mode: rs for mode, rs in results.items() if mode != "bare"}
    runs = {mode: [run for r in rs for run in r["digests"]["deterministic"]] for mode, rs in recorded.items()}  # type: ignore[index]
    same = all(run == runs["fresh"][0] for mode_runs in runs.values() for run in mode_runs)
    default_alike = {mode: all(r["digests"]["default"][i] == r["digests"]["default"][0]  # type: ignore[index]
                               for r in rs for i in range(args.repeats)) for mode, rs in recorded.items()}

    def spread(values: list[float]) -> dict[str, float]:
        return {"median": round(statistics.median(values), 3), "min": round(min(values), 3),
                "max": round(max(values), 3)}

    fork_job = [float(r["job_s"]) for r in results["fork"]]  # type: ignore[arg-type]
    fork_warm = [float(r["job_s"]) - float(r["zygote_s"]) for r in results["fork"]]  # type: ignore[arg-type]
    fresh_job = [float(r["job_s"]) for r in results["fresh"]]  # type: ignore[arg-type]
    bare_job_s = [float(r["job_s"]) for r in results["bare"]]  # type: ignore[arg-type]
    print(json.dumps({
        "workload": args.workload, "steps": args.steps, "configs": len(CONFIGS), "repeats": args.repeats,
        "world_size": results["fresh"][0]["world_size"], "device": args.device, "processes_per_mode": args.rounds,
        "job_s": {"bare_scripts": spread(bare_job_s), "fresh": spread(fresh_job), "fork": spread(fork_job),
                  "fork_zygote_warm": spread(fork_warm)},
        "fork_over_bare": round(statistics.median(fork_job) / statistics.median(bare_job_s), 3),
        "fresh_over_bare": round(statistics.median(fresh_job) / statistics.median(bare_job_s), 3),
        "every_fork_process_forked": all(r["forked"] for r in results["fork"]),
        "deterministic_config_same_digests_in_both_modes": same,
        "default_config_repeats_identical": default_alike,
    }))


if __name__ == "__main__":
    main()
