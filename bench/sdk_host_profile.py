"""Where the recorder's host time goes in bench/sdk_overhead.py's lean GPT-2 loop, for one mode in this process:
which calls of the loop wait for the GPU (torch's sync debug mode, a few steps), then, per step, the wall time the
loop's thread spends in each part of `rec.step` and the CPU time the writer thread spends on each record, and of
that the part outside its waits for the GPU (a blocking CUDA event's wait still costs some CPU, without the GIL):
what the writer takes of the GIL.

`slack` asks first whether the host's time counts at all: the bare loop (no recorder) busy-waits x ms, holding the
GIL as Python work would, at the end of every step, x cycling over blocks. While the wall clock stays flat the
GPU's queue hides that much host work per step, and shaving the recorder's host time below it buys nothing.

Timers wrap the parts (a wrapper costs about a microsecond), not a profiler: from Python 3.12 cProfile
(sys.monitoring) sees every thread at once, so a profile "of the writer" also holds the loop's calls. A part's
wall time includes any wait for the GIL while the writer holds it. A diagnosis, not a figure: the overhead
itself is bench/sdk_overhead.py's.

    python bench/sdk_host_profile.py default          # or no_drift, or slack; --size tiny --device cpu to try it
"""

from __future__ import annotations

import argparse
import collections
import functools
import statistics
import sys
import tempfile
import threading
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
from sdk_overhead import SIZES, build  # noqa: E402

spent: collections.defaultdict[str, float] = collections.defaultdict(float)


def timed(name: str, f: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(f)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return f(*args, **kwargs)
        finally:
            spent[name] += time.perf_counter() - start

    return wrapper


def instrument() -> None:
    """Wrap the parts of `rec.step`, and each job the writer runs (its CPU time: the thread's own)."""
    from detlab.sdk import recorder, spool
    from detlab.tensors import named

    for part in ("_state", "_check_tensors", "_queue"):
        setattr(recorder.Recorder, part, timed(part, getattr(recorder.Recorder, part)))
    recorder.read_scalar = timed("read_scalar (the loss)", recorder.read_scalar)
    key = named.ListKey
    recorder.named_tensors.ListKey = type("ListKey", (key,), {"__init__": timed("ListKey", key.__init__)})
    put = spool.Spool.put
    waited = threading.local()  # the writer's CPU time inside waits for the GPU (they release the GIL)

    def put_timed(self: spool.Spool, job: Any) -> None:
        def run() -> Any:
            start, waited.cpu = time.thread_time(), 0.0
            try:
                return job()
            finally:
                spent["writer CPU per record"] += time.thread_time() - start
                spent["  of it outside waits for the GPU"] += time.thread_time() - start - waited.cpu

        put(self, run)

    import torch

    synchronize = torch.cuda.Event.synchronize

    def synchronize_timed(event: torch.cuda.Event) -> None:
        start = time.thread_time()
        try:
            synchronize(event)
        finally:
            if hasattr(waited, "cpu"):
                waited.cpu += time.thread_time() - start

    torch.cuda.Event.synchronize = synchronize_timed  # type: ignore[method-assign]

    spool.Spool.put = timed("Spool.put", put_timed)  # type: ignore[method-assign]


def train_step(model: Any, opt: Any, ids: Any) -> Any:
    """One step of the lean loop (bf16 autocast forward, backward, optimizer step); its loss."""
    import torch

    with torch.autocast(ids.device.type, dtype=torch.bfloat16):
        loss = model(ids)
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    return loss


def sync(device: Any) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("mode", choices=("default", "no_drift", "slack"))
    p.add_argument("--device", default="cuda:0")
    p.add_argument("--size", choices=[s for s in SIZES if s != "mnist"], default="gpt2-small")
    p.add_argument("--blocks", type=int, default=5)
    p.add_argument("--block-steps", type=int, default=20)
    args = p.parse_args()
    import torch

    import detlab

    device = torch.device(args.device)
    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.set_device(device)
        torch.backends.cuda.matmul.allow_tf32 = True
    model, opt, vocab, ctx, batch = build(args.size, device)
    g = torch.Generator(device=device).manual_seed(0)
    batches = [torch.randint(0, vocab, (batch, ctx), device=device, generator=g) for _ in range(4)]
    if args.mode == "slack":
        slack(model, opt, batches, args, device)
        return
    instrument()
    rec = detlab.Recorder(out=Path(tempfile.mkdtemp()) / "run", drift=args.mode == "default")
    step = 0
    in_step = 0.0

    def steps(n: int) -> None:
        nonlocal step, in_step
        for _ in range(n):
            loss = train_step(model, opt, batches[step % len(batches)])
            start = time.perf_counter()
            rec.step(step, model, loss=loss)
            in_step += time.perf_counter() - start
            step += 1

    steps(10)
    sync(device)
    if cuda:
        with warnings.catch_warnings(record=True) as found:
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
            steps(3)
            torch.cuda.set_sync_debug_mode(0)
        waits = [w for w in found if "prototype" not in str(w.message)]
        print(f"[{args.mode}] calls that wait for the GPU in 3 steps: {len(waits)}")
        for w in waits[:10]:
            print(f"  {w.filename}:{w.lineno}: {str(w.message)[:160]}")
    per_block: collections.defaultdict[str, list[float]] = collections.defaultdict(list)
    for _ in range(args.blocks):
        sync(device)
        time.sleep(0.05)  # the writer done with the warm-up's records
        spent.clear()
        in_step = 0.0
        start = time.perf_counter()
        steps(args.block_steps)
        sync(device)
        per_block["step (wall, a sync at the block's end)"].append(time.perf_counter() - start)
        per_block["rec.step (the loop's thread)"].append(in_step)
        time.sleep(0.05)  # the block's last records written, so that each block counts its own
        for name, seconds in spent.items():
            per_block[name].append(seconds)
    rec.close()
    print(f"[{args.mode}] per step, median (min to max) over {args.blocks} blocks of {args.block_steps} steps:")
    for name, values in per_block.items():
        ms = [v / args.block_steps * 1e3 for v in values]
        print(f"  {name:40s} {statistics.median(ms):8.3f} ms  ({min(ms):.3f} to {max(ms):.3f})")


def slack(model: Any, opt: Any, batches: list[Any], args: argparse.Namespace, device: Any) -> None:
    busy_ms = (0.0, 0.5, 1.0, 2.0, 4.0)
    step = 0

    def steps(n: int, busy: float) -> None:
        nonlocal step
        for _ in range(n):
            train_step(model, opt, batches[step % len(batches)])
            until = time.perf_counter() + busy / 1e3
            while time.perf_counter() < until:  # Python work's way: the GIL held, a core busy
                pass
            step += 1

    steps(10, 0.0)
    sync(device)
    walls: dict[float, list[float]] = {x: [] for x in busy_ms}
    for block in range(args.blocks):
        for x in busy_ms if block % 2 == 0 else busy_ms[::-1]:
            start = time.perf_counter()
            steps(args.block_steps, x)
            sync(device)
            walls[x].append((time.perf_counter() - start) / args.block_steps * 1e3)
    base = statistics.median(walls[0.0])
    print(f"[slack] per step, median (min to max) over {args.blocks} blocks of {args.block_steps} steps, the bare loop "
          "busy-waiting x ms at each step's end:")
    for x, ms in walls.items():
        print(f"  x = {x:3.1f} ms: wall {statistics.median(ms):8.3f} ms ({min(ms):.3f} to {max(ms):.3f}), "
              f"{statistics.median(ms) - base:+.3f} ms against x = 0")


if __name__ == "__main__":
    main()
