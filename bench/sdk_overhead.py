"""What `detlab.Recorder` costs a training loop, measured as a user's loop would see it.

A lean GPT-2 written in plain PyTorch (SDPA attention, fused AdamW, bf16 autocast; no HF) trains in one process
per mode: `none` (no recorder), `default` (`detlab.Recorder(out=...)`: digests every step, drift data every tenth)
and `no_drift` (`Recorder(drift=False)`); `--every-step` adds `drift_every_step` (`Recorder(drift=True)`: drift
data at every step, the default before it sketched every tenth). Processes run interleaved (none, default,
no_drift, then the next round in another order), `--procs` per mode, so that a slow phase of the machine hits
every mode. In each process, after warm-up, `--blocks` blocks of `--block-steps` steps are timed by the wall clock
with a device sync only at each block's end: per step, what the loop pays, the host's work included. Each mode's
step is the median over all its blocks; the overhead is that median against `none`'s.

    python bench/sdk_overhead.py                          # GPT-2 small, batch 8 x 1024, on cuda:0
    python bench/sdk_overhead.py --device cpu --size tiny --procs 1 --blocks 2 --block-steps 2   # a smoke test

It writes `--out DIR/sdk_overhead.json` (default results/<date>-<device>-sdk-overhead/) = {"device", "model",
"step_ms": {"none", "default", "no_drift"}, "overhead_pct": {"default", "no_drift"}, "processes_per_mode",
"blocks"} plus every block's time per process, and prints it. It also states the noise: `none`'s processes
differ among themselves ("noise_pct": their spread, (max - min) / median), and each mode's overhead per round
(against that round's `none`) ranges over "overhead_range_pct"; an overhead no larger than the noise is printed
as within noise, not as a figure to compare with a target. "overhead_ci95_pct" is each mode's overhead in 95 %
of a bootstrap that draws the processes of the mode and of `none` again (the process is what varies between
runs): an interval that holds a target does not tell the overhead from it. Each recorded mode also gives the
time the loop's own thread spends inside `rec.step` ("rec_step_host_ms"): an overhead near the device's
kernels plus this time says the loop pays the host's work; one near the kernels alone, that the device's queue
hides it. The time includes any wait for the writer (a loop four records ahead of it waits in `rec.step`), so
it bounds the host's work from above. `--kernels` adds two modes that split the cost: `gpu_onepass` replays
the default recorder's captured GPU work (digests, stats and sketch of the same tensors) after every step and
`gpu_fingerprint` the fingerprint's alone (what drift=False queues), with nothing read back, written or handed
to a thread: what the GPU's work costs the loop by itself.

`--timeline N` asks the GPU's own timeline where a cost goes: after the timed blocks, each process runs N more
steps under torch.profiler (CUDA activity only, no CPU-op tracing), one 1-cycle `spin_kernel` queued at each
step's start to mark it on the device. Per step after the first three (the queue filling from idle), from one
marker to the next: the step's time on the GPU, the time some kernel or copy ran (busy) and none did (idle, with
its gaps), the recorder's kernels, the copies, and each of the model's kernels; the median over those steps. A
mode that costs more with as much idle is slower kernels; with more idle, a stream that waits. The traces are
kept (`--out DIR/traces/`, gzipped, for Perfetto); the profiled steps are not in the timed blocks.
"""

from __future__ import annotations

import argparse
import bisect
import collections
import datetime
import gzip
import json
import math
import os
import random
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

MODES = ("none", "default", "no_drift")
# --before adds the default recorder as it was before issue 23 (two passes on CUDA, at the call on the CPU, the
# torch fingerprint on the CPU): before and after from the same run.
BEFORE = "default_before"
BEFORE_ENV = {"DETLAB_ONEPASS": "0", "DETLAB_CPU_DEFER": "0", "DETLAB_FP_NUMBA": "0"}
EVERY_STEP = "drift_every_step"  # --every-step: Recorder(drift=True)
KERNELS = ("gpu_onepass", "gpu_fingerprint")  # --kernels: the recorder's GPU work alone
# --timeline: the recorder's Triton kernels (detlab/tensors), the step marker (torch.cuda._sleep's kernel), the
# steps a timeline skips while the queue fills.
DETLAB_KERNELS = ("_onepass_kernel", "_per_tensor_kernel", "_rows_kernel", "_fp_kernel", "_finalize_kernel")
MARKER = "spin_kernel"  # at::cuda::(anonymous namespace)::spin_kernel(long), demangled
TIMELINE_SKIP = 3
SIZES = {  # layers, embedding, heads, vocabulary, context, batch
    "gpt2-small": (12, 768, 12, 50257, 1024, 8),
    "tiny": (2, 64, 2, 256, 32, 2),
    # Not a GPT: PyTorch's MNIST example's network and loop (batch 64, Adadelta, fp32), on random images.
    "mnist": (0, 0, 0, 10, 28, 64),
}


# ---- the model: nanoGPT-like GPT-2 in plain torch --------------------------------------------------------
def build(size: str, device: Any) -> tuple[Any, Any, int, int, int]:
    import torch
    from torch import nn
    from torch.nn import functional as F  # noqa: N812

    layers, embd, heads, vocab, ctx, batch = SIZES[size]

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.ln1, self.ln2 = nn.LayerNorm(embd), nn.LayerNorm(embd)
            self.qkv, self.proj = nn.Linear(embd, 3 * embd), nn.Linear(embd, embd)
            self.fc, self.out = nn.Linear(embd, 4 * embd), nn.Linear(4 * embd, embd)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            b, t, c = x.shape
            q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, heads, c // heads).permute(2, 0, 3, 1, 4)
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + self.proj(y.transpose(1, 2).reshape(b, t, c))
            return x + self.out(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))

    class GPT(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.wte, self.wpe = nn.Embedding(vocab, embd), nn.Embedding(ctx, embd)
            self.blocks = nn.ModuleList(Block() for _ in range(layers))
            self.ln_f = nn.LayerNorm(embd)
            self.head = nn.Linear(embd, vocab, bias=False)
            self.head.weight = self.wte.weight  # tied, as GPT-2's

        def forward(self, ids: torch.Tensor) -> torch.Tensor:
            x = self.wte(ids) + self.wpe(torch.arange(ids.shape[1], device=ids.device))
            for block in self.blocks:
                x = block(x)
            logits = self.head(self.ln_f(x))
            return F.cross_entropy(logits[:, :-1].reshape(-1, vocab).float(), ids[:, 1:].reshape(-1))

    torch.manual_seed(0)
    model = GPT().to(device)
    fused = device.type == "cuda"  # fused AdamW on CUDA, as a lean loop would; foreach on the CPU
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=fused, foreach=None if fused else True)
    return model, opt, vocab, ctx, batch


def build_mnist(device: Any) -> tuple[Any, Any, list[tuple[Any, ...]]]:
    """pytorch/examples' mnist/main.py: its Net, Adadelta(lr=1.0), batches of 64 (random images and labels)."""
    import torch
    from torch import nn
    from torch.nn import functional as F  # noqa: N812

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv1, self.conv2 = nn.Conv2d(1, 32, 3, 1), nn.Conv2d(32, 64, 3, 1)
            self.dropout1, self.dropout2 = nn.Dropout(0.25), nn.Dropout(0.5)
            self.fc1, self.fc2 = nn.Linear(9216, 128), nn.Linear(128, 10)

        def forward(self, x: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
            x = F.max_pool2d(F.relu(self.conv2(F.relu(self.conv1(x)))), 2)
            x = self.dropout2(F.relu(self.fc1(torch.flatten(self.dropout1(x), 1))))
            return F.nll_loss(F.log_softmax(self.fc2(x), dim=1), target)

    torch.manual_seed(0)
    model = Net().to(device)
    g = torch.Generator(device=device).manual_seed(0)
    batches = [(torch.randn(64, 1, 28, 28, device=device, generator=g),
                torch.randint(0, 10, (64,), device=device, generator=g)) for _ in range(16)]
    return model, torch.optim.Adadelta(model.parameters(), lr=1.0), batches


class GpuWork:
    """The recorder's GPU work alone, on the tensors it records by default (the model's parameters): its captured
    graph replayed after every step; nothing is read back, written or handed to another thread."""

    def __init__(self, model: Any, mode: str) -> None:
        from detlab.tensors import onepass_triton
        from detlab.tensors.fingerprint import triton_impl

        tensors = [t.detach() for t in model.parameters()]
        if mode == "gpu_fingerprint":
            fp = triton_impl.plan(tensors)
            self._run = lambda: triton_impl.run(fp)
        else:
            plan = onepass_triton.plan(tensors, range(len(tensors)))
            slot = onepass_triton._new_slot(plan)
            self._run = lambda: onepass_triton.run(plan, slot)

    def step(self, step: int, model: Any, loss: Any = None) -> None:
        self._run()


# ---- one process: one mode ------------------------------------------------------------------------------
def child(args: argparse.Namespace) -> dict[str, Any]:
    import torch

    device = torch.device(args.device)
    if device.type == "cuda":
        torch.cuda.set_device(device)
        torch.backends.cuda.matmul.allow_tf32 = True
    autocast = args.size != "mnist"  # the MNIST example trains in fp32
    if args.size == "mnist":
        model, opt, batches = build_mnist(device)
    else:
        model, opt, vocab, ctx, batch = build(args.size, device)
        g = torch.Generator(device=device).manual_seed(0)
        # Random tokens made up front: the loop reads its data, it does not make it.
        batches = [(torch.randint(0, vocab, (batch, ctx), device=device, generator=g),) for _ in range(16)]
    if args.compile:
        model = torch.compile(model)
    rec: Any = None
    if args.mode in KERNELS:
        rec = GpuWork(model, args.mode)
    elif args.mode != "none":
        import detlab

        if args.mode == BEFORE:
            os.environ.update(BEFORE_ENV)
        drift = {"no_drift": False, EVERY_STEP: True, BEFORE: True}.get(args.mode)  # else the default's
        rec = detlab.Recorder(out=Path(args.rec_dir) / f"{args.mode}-{os.getpid()}",
                              **({} if drift is None else {"drift": drift}))

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    step = 0
    in_rec: list[float] = []  # seconds inside rec.step, per timed step

    def steps(n: int, mark: bool = False) -> None:
        nonlocal step
        for _ in range(n):
            if mark:
                torch.cuda._sleep(1)
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=autocast):
                loss = model(*batches[step % len(batches)])
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            if rec is not None:
                t = time.perf_counter()
                rec.step(step, model, loss=loss)
                in_rec.append(time.perf_counter() - t)
            step += 1

    steps(args.warmup)
    sync()
    in_rec.clear()
    blocks = []
    for _ in range(args.blocks):
        t0 = time.perf_counter()
        steps(args.block_steps)
        sync()
        blocks.append((time.perf_counter() - t0) / args.block_steps * 1e3)
    rec_step_host_ms = statistics.median(in_rec) * 1e3 if in_rec else None
    timeline = None
    if args.timeline:
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            steps(args.timeline, mark=True)
            sync()
        trace = Path(args.rec_dir) / f"trace-{args.mode}-{os.getpid()}.json.gz"
        prof.export_chrome_trace(str(trace))  # gzipped, by its name
        with gzip.open(trace, "rt") as f:
            timeline = read_timeline(json.load(f))
    recorded = None  # steps in the recording, for the modes that record
    if rec is not None and not isinstance(rec, GpuWork):
        rec.close()  # outside the timed blocks; every step's record must be there
        from detlab.sdk import load_run

        assert rec.out is not None
        recorded = len(load_run(rec.out).steps())
    return {"mode": args.mode, "pid": os.getpid(), "block_ms": blocks, "steps_recorded": recorded,
            "rec_step_host_ms": rec_step_host_ms, "timeline": timeline, "steps": step, "torch": torch.__version__,
            "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"}


# ---- the GPU's timeline ----------------------------------------------------------------------------------
def read_timeline(trace: dict[str, Any], skip: int = TIMELINE_SKIP) -> dict[str, Any]:
    """Per marked step of a torch.profiler Chrome trace (times in ms, medians over the steps after `skip`): the
    step on the GPU (marker to marker), busy (the union of kernels, copies and memsets on every stream), idle and
    its gaps over 20 µs, the recorder's kernels, the copies, each model kernel; and the host's CUDA calls."""
    timed = [e for e in trace["traceEvents"] if e.get("ph") == "X" and "dur" in e]
    device = sorted((float(e["ts"]), float(e["ts"]) + float(e["dur"]), e["name"], e["cat"]) for e in timed
                     if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset"))
    marks = [(start, stop) for start, stop, name, _ in device if MARKER in name]
    if len(marks) < skip + 2:
        raise ValueError(f"{len(marks)} step markers ({MARKER}) in the trace: fewer than {skip + 2}")
    steps = list(zip(marks[skip:], marks[skip + 1:], strict=False))
    per_step: list[dict[str, Any]] = []
    gaps: list[tuple[float, str, str]] = []  # (µs, what ran before, what ran after)
    for (lo, end), (hi, _) in steps:
        busy, last, spent = end - lo, MARKER, collections.Counter[str]()
        for start, stop, name, cat in device[bisect.bisect_right(device, (lo, math.inf)):]:  # after the marker
            if start >= hi:
                break
            if start > end and start - end > 20:
                gaps.append((start - end, last, name))
            busy += max(0.0, stop - max(start, end))
            if stop > end:
                end, last = stop, name
            spent[name if cat == "kernel" and not name.startswith(DETLAB_KERNELS) else
                  "recorder kernels" if cat == "kernel" else "copies and memsets"] += stop - start
        if hi - end > 20:  # idle until the next step's marker
            gaps.append((hi - end, last, MARKER))
        per_step.append({"gpu_step": hi - lo, "busy": busy, "spent": spent})
    per_ms = lambda xs: round(statistics.median(xs) / 1e3, 4)  # noqa: E731  µs to ms
    host: collections.defaultdict[str, list[float]] = collections.defaultdict(list)
    for e in timed:
        if e.get("cat") in ("cuda_runtime", "cuda_driver") and steps[0][0][0] <= float(e["ts"]) < steps[-1][1][0]:
            host[e["name"]].append(float(e["dur"]))
    n = len(per_step)
    return {
        "steps": n,
        "gpu_step_ms": per_ms([s["gpu_step"] for s in per_step]),
        "busy_ms": per_ms([s["busy"] for s in per_step]),
        "idle_ms": per_ms([s["gpu_step"] - s["busy"] for s in per_step]),
        "gaps_over_20us_per_step": len(gaps) / n,
        "largest_gaps": [{"us": round(us, 1), "after": a[:100], "before": b[:100]}
                         for us, a, b in sorted(gaps, reverse=True)[:8]],
        "spent_ms": {k: per_ms([s["spent"][k] for s in per_step]) for k in sorted({k for s in per_step
                                                                                   for k in s["spent"]})},
        "host_calls": {k: {"per_step": len(v) / n, "ms_per_step": round(sum(v) / n / 1e3, 4)}
                       for k, v in sorted(host.items(), key=lambda kv: -sum(kv[1]))[:12]},
    }


# ---- the parent: interleaved processes -------------------------------------------------------------------
def bootstrap_pct(blocks: list[list[float]], base: list[list[float]], draws: int = 2000) -> list[float] | None:
    """The 2.5th and 97.5th percentiles of the overhead (median of all blocks against `base`'s) when the processes
    of each side are drawn again with replacement (seeded: the same figures from the same blocks); None with one
    process a side."""
    if len(blocks) < 2 or len(base) < 2:
        return None
    rng = random.Random(0)
    med = lambda runs: statistics.median(b for run in rng.choices(runs, k=len(runs)) for b in run)  # noqa: E731
    drawn = sorted((med(blocks) / med(base) - 1) * 100 for _ in range(draws))
    return [drawn[round(0.025 * (draws - 1))], drawn[round(0.975 * (draws - 1))]]


def device_tag(name: str) -> str:
    found = re.search(r"\b([A-Z]\d{2,4}[A-Za-z]*)\b", name)
    return (found.group(1) if found else name.split()[0]).lower()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda:0")
    p.add_argument("--size", choices=SIZES, default="gpt2-small")
    p.add_argument("--compile", action="store_true", help="torch.compile the model")
    p.add_argument("--procs", type=int, default=3, help="processes per mode (interleaved)")
    p.add_argument("--blocks", type=int, default=10, help="timed blocks per process")
    p.add_argument("--block-steps", type=int, default=20, help="steps per block")
    # 25: past the default's third sketched step (0, 10, 20), so its one-pass graph, captured at the second, is
    # replayed before the timed blocks.
    p.add_argument("--warmup", type=int, default=25)
    p.add_argument("--out", type=Path, default=None, help="directory for sdk_overhead.json")
    p.add_argument("--before", action="store_true",
                   help=f"also a mode {BEFORE}: the default recorder with {BEFORE_ENV}")
    p.add_argument("--every-step", action="store_true",
                   help=f"also a mode {EVERY_STEP}: the recorder with drift data at every step")
    p.add_argument("--kernels", action="store_true",
                   help=f"also modes {', '.join(KERNELS)}: the recorder's GPU work alone (CUDA only)")
    p.add_argument("--timeline", type=int, default=0, metavar="N",
                   help=f"after the timed blocks, N steps under torch.profiler, each step's GPU timeline (CUDA only; "
                        f"N > {TIMELINE_SKIP + 1})")
    p.add_argument("--child", dest="mode", choices=(*MODES, EVERY_STEP, BEFORE, *KERNELS), default=None,
                   help=argparse.SUPPRESS)
    p.add_argument("--rec-dir", default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.kernels and not args.device.startswith("cuda"):
        p.error("--kernels times the recorder's CUDA kernels: it needs --device cuda[:N]")
    if args.timeline and (not args.device.startswith("cuda") or args.timeline <= TIMELINE_SKIP + 1):
        p.error(f"--timeline reads the GPU's timeline: it needs --device cuda[:N] and N > {TIMELINE_SKIP + 1}")
    if args.mode is not None:
        print(json.dumps(child(args)), flush=True)
        return
    modes = (*MODES, *((EVERY_STEP,) if args.every_step else ()), *((BEFORE,) if args.before else ()),
             *(KERNELS if args.kernels else ()))
    runs: dict[str, list[dict[str, Any]]] = {m: [] for m in modes}
    with tempfile.TemporaryDirectory() as rec_dir:
        for r in range(args.procs):
            # Rotate the order every round: no mode always runs first (cold caches) or last.
            order = modes[r % len(modes):] + modes[: r % len(modes)]
            for mode in order:
                cmd = [sys.executable, __file__, "--child", mode, "--rec-dir", rec_dir, "--device", args.device,
                       "--size", args.size, "--blocks", str(args.blocks), "--block-steps", str(args.block_steps),
                       "--warmup", str(args.warmup), "--timeline", str(args.timeline),
                       *(["--compile"] if args.compile else [])]
                done = subprocess.run(cmd, capture_output=True, text=True)
                if done.returncode != 0:
                    sys.exit(f"{mode} process failed (exit {done.returncode}):\n{done.stderr[-4000:]}")
                result = json.loads(done.stdout.strip().splitlines()[-1])
                runs[mode].append(result)
                print(f"round {r} {mode:16s} median {statistics.median(result['block_ms']):.3f} ms/step "
                      f"(blocks {min(result['block_ms']):.3f}-{max(result['block_ms']):.3f})", flush=True)
                if result["steps_recorded"] not in (None, result["steps"]):
                    sys.exit(f"{mode}: {result['steps_recorded']} of {result['steps']} steps recorded")
            # After every round, so that a run cut short still leaves its figures.
            written = write(args, runs, final=r == args.procs - 1, traces=Path(rec_dir))
    print(json.dumps({k: written[k] for k in ("device", "model", "step_ms", "overhead_pct", "processes_per_mode",
                                              "blocks", "noise_pct", "overhead_range_pct", "overhead_ci95_pct")},
                     indent=1))
    noise = written["noise_pct"]
    for mode, pct in written["overhead_pct"].items():
        lo, hi = written["overhead_range_pct"][mode]
        ci = written["overhead_ci95_pct"][mode]
        said = ("noise not measured (one process per mode)" if noise is None else
                f"none's processes spread {noise:.2f} %" + (": within noise" if abs(pct) <= noise else ""))
        print(f"{mode}: {pct:+.2f} %, per round {lo:+.2f} to {hi:+.2f} %"
              + (f", 95 % bootstrap over processes {ci[0]:+.2f} to {ci[1]:+.2f} %" if ci is not None else "")
              + f", the loop's thread inside rec.step {written['rec_step_host_ms'][mode]:.3f} ms a step; {said}")
    if args.timeline:
        print_timeline(written["timeline"])


def print_timeline(timeline: dict[str, list[dict[str, Any]]]) -> None:
    """Each mode's GPU timeline, the median over its processes; then the model's kernels that moved against none."""
    groups = ("recorder kernels", "copies and memsets")
    med = lambda runs, f: statistics.median(f(t) for t in runs)  # noqa: E731
    print(f"GPU timeline per step (ms), median over processes of each one's median over {timeline['none'][0]['steps']}"
          " steps:\nmode              on GPU     busy     idle  gaps>20us  recorder  copies   model kernels")
    for mode, runs in timeline.items():
        print(f"{mode:16s} {med(runs, lambda t: t['gpu_step_ms']):8.3f} {med(runs, lambda t: t['busy_ms']):8.3f} "
              f"{med(runs, lambda t: t['idle_ms']):8.3f} {med(runs, lambda t: t['gaps_over_20us_per_step']):9.1f} "
              + " ".join(f"{med(runs, lambda t, g=g: t['spent_ms'].get(g, 0.0)):8.3f}" for g in groups)
              + f" {med(runs, lambda t: sum(v for k, v in t['spent_ms'].items() if k not in groups)):12.3f}")
    names = {k for runs in timeline.values() for t in runs for k in t["spent_ms"] if k not in groups}
    base = {k: med(timeline["none"], lambda t, k=k: t["spent_ms"].get(k, 0.0)) for k in names}
    for mode, runs in timeline.items():
        moved = sorted(((med(runs, lambda t, k=k: t["spent_ms"].get(k, 0.0)) - base[k], k) for k in names),
                       key=lambda d: -abs(d[0]))
        print(f"{mode}: the model's kernels furthest from none's (ms a step): "
              + "; ".join(f"{d:+.4f} {k[:70]}" for d, k in moved[:4]))


def write(args: argparse.Namespace, runs: dict[str, list[dict[str, Any]]], final: bool, traces: Path) -> dict[str, Any]:
    modes = list(runs)
    recorded = [m for m in modes if m != "none"]
    blocks = {m: [run["block_ms"] for run in runs[m]] for m in modes}
    step_ms = {m: statistics.median(b for run in blocks[m] for b in run) for m in modes}
    per_proc = {m: [statistics.median(run["block_ms"]) for run in runs[m]] for m in modes}
    device = runs["none"][0]["device"]
    layers, embd, heads, vocab, ctx, batch = SIZES[args.size]
    model = (f"{args.size} ({layers} layers, {embd} wide, {heads} heads, vocab {vocab}) batch {batch} x {ctx}, "
             f"SDPA, {'fused' if 'cuda' in args.device else 'foreach'} AdamW, bf16 autocast")
    if args.size == "mnist":
        model = "PyTorch's MNIST example (2 conv, 2 linear, dropout) batch 64, Adadelta, fp32"
    per_round = {m: [(a / b - 1) * 100 for a, b in zip(per_proc[m], per_proc["none"], strict=False)]
                 for m in recorded}
    result = {
        "device": device,
        "model": model + (", torch.compile" if args.compile else ""),
        "step_ms": step_ms,
        "overhead_pct": {m: (step_ms[m] / step_ms["none"] - 1) * 100 for m in recorded},
        "processes_per_mode": len(runs["none"]),
        "blocks": args.blocks,
        "block_steps": args.block_steps,
        "complete": final,
        "per_process_median_ms": per_proc,
        "per_process_overhead_pct": per_round,
        "noise_pct": ((max(per_proc["none"]) - min(per_proc["none"])) / statistics.median(per_proc["none"]) * 100
                      if len(per_proc["none"]) > 1 else None),  # one process: not measured
        "overhead_range_pct": {m: [min(v), max(v)] for m, v in per_round.items()},
        "overhead_ci95_pct": {m: bootstrap_pct(blocks[m], blocks["none"]) for m in recorded},
        # The loop's own thread inside rec.step (queueing the device's work, handing the record to the writer, and
        # waiting for the writer if four records already wait): the median over processes of each one's median
        # step. Beside the overhead it tells whether the loop pays the host's work (overhead about kernels plus
        # this) or the device hides it (overhead about kernels).
        "rec_step_host_ms": {m: statistics.median(run["rec_step_host_ms"] for run in runs[m]) for m in recorded},
        "per_process_rec_step_host_ms": {m: [run["rec_step_host_ms"] for run in runs[m]] for m in recorded},
        "block_ms": blocks,
        "timeline": {m: [run["timeline"] for run in runs[m]] for m in modes} if args.timeline else None,
        "torch": runs["none"][0]["torch"],
        "date": datetime.date.today().isoformat(),
    }
    assert all(math.isfinite(v) for v in step_ms.values())
    out = args.out or Path("results") / f"{result['date']}-{device_tag(device)}-sdk-overhead"
    out.mkdir(parents=True, exist_ok=True)
    (out / "sdk_overhead.json").write_text(json.dumps(result, indent=1) + "\n")
    for trace in traces.glob("trace-*.json.gz"):  # --timeline's, for Perfetto
        (out / "traces").mkdir(exist_ok=True)
        shutil.move(trace, out / "traces" / trace.name.removeprefix("trace-"))
    print(f"wrote {out / 'sdk_overhead.json'} ({len(runs['none'])} of {args.procs} rounds)", flush=True)
    return result


if __name__ == "__main__":
    main()
