"""Where the recorder's host time goes in bench/sdk_overhead.py's lean GPT-2 loop, for one mode in this process:
which calls of the loop wait for the GPU (torch's sync debug mode, a few steps), then a cProfile of the loop's
thread inside `rec.step` and, over the next steps, one of the writer thread inside its jobs (record building,
waits included). One profile at a time: from Python 3.12 a process holds one active profiler (sys.monitoring).
A diagnosis, not a figure: the overhead itself is bench/sdk_overhead.py's.

    python bench/sdk_host_profile.py default          # or none, no_drift; --size tiny --device cpu to try it
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import sys
import tempfile
import threading
import warnings
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
from sdk_overhead import MODES, SIZES, build  # noqa: E402


def profile_jobs(profile: cProfile.Profile) -> threading.Event:
    """Profile, on the writer thread that runs it, every job put on a Spool while the returned event is set."""
    from detlab.sdk import spool

    put = spool.Spool.put
    on = threading.Event()

    def profiled(self: spool.Spool, job: Any) -> None:
        if not on.is_set():
            put(self, job)
            return

        def run() -> Any:
            profile.enable()
            try:
                return job()
            finally:
                profile.disable()

        put(self, run)

    spool.Spool.put = profiled  # type: ignore[method-assign]
    return on


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("mode", choices=MODES)
    p.add_argument("--device", default="cuda:0")
    p.add_argument("--size", choices=[s for s in SIZES if s != "mnist"], default="gpt2-small")
    p.add_argument("--steps", type=int, default=30)
    args = p.parse_args()
    import torch

    device = torch.device(args.device)
    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.set_device(device)
        torch.backends.cuda.matmul.allow_tf32 = True
    model, opt, vocab, ctx, batch = build(args.size, device)
    g = torch.Generator(device=device).manual_seed(0)
    batches = [torch.randint(0, vocab, (batch, ctx), device=device, generator=g) for _ in range(4)]
    in_step, in_jobs = cProfile.Profile(), cProfile.Profile()
    rec, jobs_on = None, threading.Event()
    if args.mode != "none":
        import detlab

        jobs_on = profile_jobs(in_jobs)
        rec = detlab.Recorder(out=Path(tempfile.mkdtemp()) / "run", drift=args.mode == "default")
    step = 0

    def steps(n: int, profile: cProfile.Profile | None = None) -> None:
        nonlocal step
        for _ in range(n):
            with torch.autocast(device.type, dtype=torch.bfloat16):
                loss = model(batches[step % len(batches)])
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            if rec is not None:
                if profile is not None:
                    profile.enable()
                rec.step(step, model, loss=loss)
                if profile is not None:
                    profile.disable()
            step += 1

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize(device)

    steps(5)
    sync()
    if cuda:
        with warnings.catch_warnings(record=True) as found:
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
            steps(3)
            torch.cuda.set_sync_debug_mode(0)
        print(f"[{args.mode}] calls that wait for the GPU in 3 steps: {len(found)}")
        for w in found[:10]:
            print(f"  {w.filename}:{w.lineno}: {str(w.message)[:160]}")
    if rec is None:
        return
    steps(args.steps, in_step)
    sync()
    jobs_on.set()  # from here the writer's jobs are profiled and the loop's thread is not
    steps(args.steps)
    sync()
    rec.close()
    for name, profile in ((f"the loop's thread in rec.step, {args.steps} steps", in_step),
                          (f"the writer thread in its jobs, the next {args.steps} steps", in_jobs)):
        out = io.StringIO()
        pstats.Stats(profile, stream=out).sort_stats("tottime").print_stats(20)
        print(f"==== [{args.mode}] {name}\n{out.getvalue()}")


if __name__ == "__main__":
    main()
