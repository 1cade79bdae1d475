"""What forking ranks from the zygote saves: a job's runs (configs × repeats of a train workload) launched as the
worker launches them, with ranks forked from the zygote against ranks started as fresh processes
(DETLAB_FORK_RANKS=0, as before the zygote), and against the same training as bare scripts (no detlab; issue 23's
time to verdict is the job's time over theirs).

One process per mode, `--rounds` of each, interleaved (fork, fresh, bare, server, fork ...). Each process runs
the whole job in turn and reports its wall time, the zygote's start (the first run of a worker pays it once) and
every run's step digests: the deterministic config's runs must have the same digests in both modes. Mode `server`
is the job as a user submits it: `detlab up` (embedded: SQLite, its broker, one worker) started and answering
first, then the job's time from its submission through the API to its stored result (dispatch, the worker's
zygote start, the runs, ingest, settle); the deterministic config's repeats must read identical there. Prints one
line per process and a JSON summary with medians and spreads.

    python bench/fork_ranks.py [--workload tiny-lm] [--steps 10] [--repeats 3] [--rounds 3] [--device cuda]
                               [--modes fork,fresh,bare,server]
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


def server_job(workload: str, steps: int, repeats: int, device: str) -> dict[str, object]:
    """`detlab up` on a free port of 127.0.0.1 and a data folder of its own; once its worker is live, the job
    through the API: job_s from the submission to the job's result, start_s the server's start until then."""
    import httpx
    import torch

    from detlab.worker.launch import free_port

    world = max(torch.cuda.device_count(), 1) if device == "cuda" else 2
    configs = [{"name": name, "torch": flags, "env": env} for name, (flags, env) in CONFIGS.items()]
    url = f"http://127.0.0.1:{free_port()}"
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as data, open(Path(data) / "up.log", "w+") as log:
        up = subprocess.Popen([sys.executable, "-m", "detlab.cli", "up", "--port", url.rsplit(":", 1)[1],
                               "--data-dir", data], stdout=log, stderr=subprocess.STDOUT)
        try:
            with httpx.Client(base_url=url, timeout=30) as api:
                def answered(path: str) -> httpx.Response | None:
                    if up.poll() is not None:
                        log.seek(0)
                        raise RuntimeError(f"detlab up exited {up.returncode}: {log.read()[-3000:]}")
                    try:
                        return api.get(path)
                    except httpx.TransportError:
                        return None

                while (live := answered("/api/v1/health")) is None or live.status_code != 200:  # a live worker
                    time.sleep(0.2)
                start_s = time.perf_counter() - started
                submitted = time.perf_counter()
                created = api.post("/api/v1/jobs", json={"workload": workload, "configs": configs, "world_size": world,
                                                        "steps": steps, "repeats": repeats})
                created.raise_for_status()
                job_id = created.json()["id"]
                while (read := answered(f"/api/v1/jobs/{job_id}")) is None or read.json()["status"] in ("queued",
                                                                                                       "running"):
                    time.sleep(0.1)
                job_s = time.perf_counter() - submitted
                job = read.json()
                result = api.get(job["result_path"]).json() if job["result_path"] else {}
        finally:
            up.terminate()
            up.wait(timeout=60)
    identical = {row["name"]: [row["identical_to_first"], row["comparable"]]
                 for row in result.get("reproducibility", [])}
    return {"job_s": job_s, "zygote_s": 0.0, "start_s": start_s, "world_size": world, "status": job["status"],
            "identical_to_first_of_comparable": identical}


MODES = {"fork": job, "fresh": job, "bare": bare_job, "server": server_job}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", default="tiny-lm")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    parser.add_argument("--modes", default=",".join(MODES), help="which of fork, fresh, bare, server (fork and "
                        "fresh are compared with each other, the others with bare)")
    parser.add_argument("--one", choices=MODES, help=argparse.SUPPRESS)  # a measuring process
    args = parser.parse_args()
    if args.one:
        print(json.dumps(MODES[args.one](args.workload, args.steps, args.repeats, args.device)))
        return
    results: dict[str, list[dict[str, object]]] = {mode: [] for mode in args.modes.split(",")}
    if not results or not set(results) <= set(MODES) or "bare" not in results:
        parser.error(f"--modes: some of {', '.join(MODES)}, bare among them")
    for _ in range(args.rounds):
        for mode in results:
            env = {**os.environ, "DETLAB_FORK_RANKS": "0" if mode == "fresh" else "1"}
            out = subprocess.run([sys.executable, __file__, "--one", mode, "--workload", args.workload,
                                  "--steps", str(args.steps), "--repeats", str(args.repeats), "--device", args.device],
                                 env=env, check=True, capture_output=True, text=True).stdout
            result = json.loads(out.splitlines()[-1])
            results[mode].append(result)
            print(mode, f"job {result['job_s']:.2f} s", f"zygote start {result['zygote_s']:.2f} s", flush=True)

    def spread(values: list[float]) -> dict[str, float]:
        return {"median": round(statistics.median(values), 3), "min": round(min(values), 3),
                "max": round(max(values), 3)}

    job_s = {mode: [float(r["job_s"]) for r in rs] for mode, rs in results.items()}  # type: ignore[arg-type]
    bare = statistics.median(job_s.pop("bare"))
    summary: dict[str, object] = {
        "workload": args.workload, "steps": args.steps, "configs": len(CONFIGS), "repeats": args.repeats,
        "world_size": results["bare"][0]["world_size"], "device": args.device, "processes_per_mode": args.rounds,
        "job_s": {"bare_scripts": spread([float(r["job_s"]) for r in results["bare"]]),  # type: ignore[arg-type]
                  **{mode: spread(times) for mode, times in job_s.items()}},
        **{f"{mode}_over_bare": round(statistics.median(times) / bare, 3) for mode, times in job_s.items()}}
    if "fork" in results:
        summary["job_s"]["fork_zygote_warm"] = spread([float(r["job_s"]) - float(r["zygote_s"])  # type: ignore[index]
                                                       for r in results["fork"]])
        summary["every_fork_process_forked"] = all(r["forked"] for r in results["fork"])
    # The deterministic config's runs must all be alike, whichever way their ranks started; the default config's
    # repeats may part on a GPU (that is what detlab finds), so they are only reported.
    recorded = {mode: rs for mode, rs in results.items() if mode in ("fork", "fresh")}
    if recorded:
        runs = [run for rs in recorded.values() for r in rs for run in r["digests"]["deterministic"]]  # type: ignore[index]
        summary["deterministic_config_same_digests_in_both_modes"] = all(run == runs[0] for run in runs)
        summary["default_config_repeats_identical"] = {
            mode: all(r["digests"]["default"][i] == r["digests"]["default"][0]  # type: ignore[index]
                      for r in rs for i in range(args.repeats)) for mode, rs in recorded.items()}
    if "server" in results:
        summary["server_start_s"] = spread([float(r["start_s"]) for r in results["server"]])  # type: ignore[arg-type]
        summary["server_job_status"] = [r["status"] for r in results["server"]]
        summary["server_identical_to_first_of_comparable"] = [r["identical_to_first_of_comparable"]
                                                              for r in results["server"]]
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
