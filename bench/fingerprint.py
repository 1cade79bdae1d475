"""Benchmark and self-check for fp1 tensor fingerprints (detlab.tensors.fingerprint).

    PYTHONPATH=. python3 bench/fingerprint.py [--cpu-only] [--json PATH]   # timings (+ a quick check)
    PYTHONPATH=. python3 bench/fingerprint.py --check                    # triton/torch vs numpy only
    PYTHONPATH=. python3 bench/fingerprint.py --baseline DIR             # also time an older copy of the package

`--baseline DIR` loads DIR/__init__.py (a copy of detlab/tensors/fingerprint from another commit) as a package and
times its Triton path next to the current one on the same tensors, for before/after figures from one run.

GPU timings use CUDA events after warm-up; every figure is a median with min/max and IQR over repeats.
GB/s are 1e9 bytes of tensor input per second. A section that fails is reported and skipped, so one
problem (say, no torch.hash_tensor) does not cost the rest of the run.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib
import importlib.util
import json
import platform
import random
import statistics
import sys
import time
import traceback
from collections.abc import Callable
from functools import partial
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from detlab.tensors.fingerprint import (
    fingerprint,
    fingerprint_bytes,
    fingerprint_many,
    implementation_name,
    tensor_bytes,
)
from detlab.tensors.fingerprint.torch_impl import fingerprint_torch

DTYPES = [
    torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.float8_e4m3fn, torch.float8_e5m2,
    torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8, torch.bool, torch.complex64,
]  # fmt: skip
GiB = 1 << 30
# Kernel configurations timed by the "triton kernel configurations" section: (block, iters, num_warps, prefetch).
CONFIGS = [(512, 32, 4, False), (1024, 32, 8, False), (512, 64, 4, False), (256, 64, 2, False),
           (512, 16, 4, False), (512, 32, 4, True), (1024, 32, 8, True)]  # fmt: skip
# The package given by --baseline, if any.
baseline: ModuleType | None = None


def load_baseline(path: str) -> ModuleType:
    """Import DIR/__init__.py as the package `fp_baseline` (its relative imports resolve inside DIR)."""
    init = Path(path) / "__init__.py"
    spec = importlib.util.spec_from_file_location("fp_baseline", init, submodule_search_locations=[path])
    if spec is None or spec.loader is None or not init.exists():
        raise SystemExit(f"--baseline {path}: no __init__.py there; give a copy of detlab/tensors/fingerprint")
    module = importlib.util.module_from_spec(spec)
    sys.modules["fp_baseline"] = module
    spec.loader.exec_module(module)
    return module


# --- timing -----------------------------------------------------------------------------------------------


def spread(samples: list[float]) -> dict[str, float]:
    """Median, min, max and quartiles of a list of samples."""
    q = statistics.quantiles(samples, n=4) if len(samples) > 1 else [samples[0]] * 3
    return {"median": statistics.median(samples), "min": min(samples), "max": max(samples),
            "q1": q[0], "q3": q[2], "n": len(samples)}  # fmt: skip


def time_cpu(fn: Callable[[], Any], repeats: int, warmup: int = 1) -> list[float]:
    """Seconds per call on the host clock."""
    for _ in range(warmup):
        fn()
    out = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out


def time_cuda(fn: Callable[[], Any], repeats: int, warmup: int = 2) -> list[float]:
    """Seconds per call from CUDA events around each call, after warm-up."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    out = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        out.append(start.elapsed_time(end) / 1e3)
    return out


def bandwidth(nbytes: int, seconds: list[float]) -> dict[str, float]:
    """GB/s summary of timed reads of nbytes (the fastest call gives max GB/s)."""
    s = spread(seconds)
    return {"gbps": nbytes / s["median"] / 1e9, "gbps_min": nbytes / s["max"] / 1e9,
            "gbps_max": nbytes / s["min"] / 1e9, "gbps_q1": nbytes / s["q3"] / 1e9,
            "gbps_q3": nbytes / s["q1"] / 1e9, "n": s["n"], "bytes": nbytes}  # fmt: skip


def show(name: str, r: dict[str, float]) -> None:
    if "gbps" in r:
        print(f"  {name:<34} {r['gbps']:9.2f} GB/s  (min {r['gbps_min']:.2f}, max {r['gbps_max']:.2f}, "
              f"IQR {r['gbps_q1']:.2f}-{r['gbps_q3']:.2f}, n={r['n']})")  # fmt: skip
    else:
        print(f"  {name:<34} {r['median'] * 1e3:9.3f} ms    (min {r['min'] * 1e3:.3f}, max {r['max'] * 1e3:.3f},"
              f" IQR {r['q1'] * 1e3:.3f}-{r['q3'] * 1e3:.3f}, n={r['n']})")  # fmt: skip


# --- self-check ------------------------------------------------------------------------------------------


def random_tensor(dtype: torch.dtype, numel: int, seed: int) -> torch.Tensor:
    """Random raw bytes viewed as dtype (bool gets 0/1 bytes)."""
    gen = torch.Generator().manual_seed(seed)
    if dtype == torch.bool:
        return torch.randint(0, 2, (numel,), generator=gen).bool()
    esize = torch.empty(0, dtype=dtype).element_size()
    return torch.randint(0, 256, (numel * esize,), dtype=torch.uint8, generator=gen).view(dtype)


def check_cases(device: str, full: bool) -> list[tuple[str, torch.Tensor]]:
    rng = random.Random(0)
    sizes = [0, 1, 3, 7, 8, 9, 4097, 32771]
    if full:
        sizes += [2, 5, 31, 1000, 4095, 4096, 1 << 20] + [rng.randrange(1, 300_000) for _ in range(12)]
    cases = []
    for dtype in DTYPES:
        for seed, n in enumerate(sizes):
            cases.append((f"{dtype} n={n}", random_tensor(dtype, n, seed).to(device)))
    base = random_tensor(torch.float32, 4 * 1031, 99).to(device).reshape(4, 1031)
    cases += [("0-d float32", torch.tensor(1.5, device=device)), ("transpose", base.t()),
              ("step slice", base[:, ::3]), ("uint8 offset 1", base.view(torch.uint8).reshape(-1)[1:]),
              ("bf16 offset 3", base.to(torch.bfloat16).reshape(-1)[3:])]  # fmt: skip
    return cases


def run_check(full: bool) -> tuple[list[str], dict[str, Any]]:
    """Compare every implementation on this machine with the numpy reference; return mismatches."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    cases = check_cases(device, full)
    expected = [fingerprint_bytes(tensor_bytes(t)) for _, t in cases]
    impls: dict[str, Callable[[list[torch.Tensor]], list[str]]] = {
        f"torch-{device}": lambda ts: [fingerprint_torch(t) for t in ts]
    }
    if device == "cuda":
        try:
            from detlab.tensors.fingerprint.triton_impl import fingerprint_many_triton
        except ImportError as exc:
            print(f"  triton not importable ({exc}): Triton kernel NOT checked")
        else:
            impls["triton (one launch per tensor)"] = lambda ts: [fingerprint_many_triton([t])[0] for t in ts]
            impls["triton (one launch for all)"] = fingerprint_many_triton
            # Each tensor twice in a row: the second call reuses the kept launch table.
            impls["triton (per tensor, kept plan)"] = lambda ts: [
                [fingerprint_many_triton([t]) for _ in range(2)][1][0] for t in ts
            ]
    impls[f"dispatch ({implementation_name(device)})"] = fingerprint_many
    problems = []
    for name, fn in impls.items():
        try:
            got = fn([t for _, t in cases])
        except Exception as exc:
            problems.append(f"{name}: raised {type(exc).__name__}: {exc}")
            continue
        bad = [f"{name}: {label}: got {g}, reference {e}"
               for (label, _), g, e in zip(cases, got, expected, strict=True) if g != e]  # fmt: skip
        problems += bad
        print(f"  {name:<34} {len(cases) - len(bad)}/{len(cases)} cases match the numpy reference")
    return problems, {"cases": len(cases), "implementations": list(impls), "mismatches": problems[:50]}


# --- a GPT-2-small-sized model ----------------------------------------------------------------------------


class Block(nn.Module):
    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln_1, self.ln_2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.c_attn, self.attn_proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.c_fc, self.mlp_proj = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2)
                   for z in self.c_attn(self.ln_1(x)).split(c, dim=2))  # fmt: skip
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.attn_proj(y.transpose(1, 2).reshape(b, t, c))
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


class GPT2Small(nn.Module):
    """124M parameters in 148 tensors (tied LM head), the shapes of GPT-2 small."""

    def __init__(self, vocab: int = 50257, ctx: int = 1024, d: int = 768, layers: int = 12) -> None:
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab, d), nn.Embedding(ctx, d)
        self.blocks = nn.ModuleList(Block(d, 12) for _ in range(layers))
        self.ln_f = nn.LayerNorm(d)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1], device=idx.device))
        for block in self.blocks:
            x = block(x)
        return self.ln_f(x) @ self.wte.weight.t()


# --- sections ---------------------------------------------------------------------------------------------


def bench_cpu(res: dict[str, Any]) -> None:
    x = torch.randn(16 << 20)  # 64 MiB float32
    nbytes = x.numel() * 4
    res["torch-cpu fingerprint"] = bandwidth(nbytes, time_cpu(lambda: fingerprint_torch(x), 5))
    raw = x.numpy().view(np.uint8).data
    res["numpy reference fingerprint"] = bandwidth(nbytes, time_cpu(lambda: fingerprint_bytes(raw), 3))
    res["hashlib sha256"] = bandwidth(nbytes, time_cpu(lambda: hashlib.sha256(raw).digest(), 3))
    from detlab.tensors.fingerprint import cpu_impl

    if cpu_impl.available():  # the compiled kernel (numba), every core; interleaved with sha256 for a fair ratio
        fast, sha = [], []
        for _ in range(7):
            fast += time_cpu(lambda: cpu_impl.fingerprint_cpu(x), 1)
            sha += time_cpu(lambda: hashlib.sha256(raw).digest(), 1, warmup=0)
        res["numba-cpu fingerprint"] = bandwidth(nbytes, fast)
        res["hashlib sha256, interleaved with numba-cpu"] = bandwidth(nbytes, sha)
        res["numba-cpu / sha256 (median speed ratio)"] = round(statistics.median(sha) / statistics.median(fast), 2)
    from detlab.tensors import drift_numba

    if drift_numba.available():  # the recorder's writer thread also takes the stats and sketch (one thread)
        maps = drift_numba.row_maps([x.numel()], [0])
        sketched = time_cpu(lambda: drift_numba.values(maps, [x]), 5)
        res["numba-cpu stats and sketch, one thread"] = bandwidth(nbytes, sketched)


def bench_sum_reference(nbytes: int) -> dict[str, float]:
    y = torch.randn(nbytes // 4, device="cuda")  # float32 buffer of the same size, freed on return
    return bandwidth(nbytes, time_cuda(lambda: y.sum(), 20))


def bench_gpu_buffer(res: dict[str, Any]) -> None:
    x = torch.randn(GiB, device="cuda", dtype=torch.bfloat16)  # 2 GiB
    nbytes = 2 * GiB
    if implementation_name("cuda") == "triton":
        from detlab.tensors.fingerprint import triton_impl
        from detlab.tensors.fingerprint.triton_impl import fingerprint_many_triton

        res["triton fingerprint"] = bandwidth(nbytes, time_cuda(lambda: fingerprint_many_triton([x]), 20))

        def uncached() -> None:
            triton_impl.clear_plan_cache()
            fingerprint_many_triton([x])

        res["triton fingerprint, plan not kept"] = bandwidth(nbytes, time_cuda(uncached, 20))
        prepared = triton_impl.plan([x])
        res["triton kernel only (planned launch)"] = bandwidth(
            nbytes, time_cuda(lambda: triton_impl.launch(prepared), 20)
        )
        if baseline is not None and baseline.implementation_name("cuda") == "triton":
            old = importlib.import_module("fp_baseline.triton_impl")
            res["baseline triton fingerprint"] = bandwidth(
                nbytes, time_cuda(lambda: old.fingerprint_many_triton([x]), 20)
            )
            old_plan = old.plan([x])
            res["baseline kernel only"] = bandwidth(nbytes, time_cuda(lambda: old.launch(old_plan), 20))
    else:
        print("  (Triton unavailable: no Triton figure)")
    res["torch-cuda fingerprint"] = bandwidth(nbytes, time_cuda(lambda: fingerprint_torch(x), 5))
    res["float32 .sum() (read reference)"] = bench_sum_reference(nbytes)
    hash_tensor = getattr(torch, "hash_tensor", None)
    if hash_tensor is not None:
        res["torch.hash_tensor"] = bandwidth(nbytes, time_cuda(lambda: hash_tensor(x), 10))
    part = x.reshape(-1)[: 128 << 20]  # 256 MiB slice; sha256 runs at host speed, the rate is what scales

    def sha() -> None:
        hashlib.sha256(part.view(torch.uint8).cpu().numpy().data).digest()

    res["sha256 after host copy (256 MiB)"] = bandwidth(part.numel() * 2, time_cuda(sha, 3, warmup=1))


def bench_model(res: dict[str, Any]) -> None:
    model = GPT2Small().cuda()
    fp32 = [p.detach() for p in model.parameters()]
    bf16 = [p.to(torch.bfloat16) for p in fp32]
    res["parameters"] = sum(p.numel() for p in fp32)
    res["tensors"] = len(fp32)
    res["bf16 one multi-tensor call"] = spread(time_cuda(lambda: fingerprint_many(bf16), 20))
    if implementation_name("cuda") == "triton":
        from detlab.tensors.fingerprint import triton_impl

        prepared = triton_impl.plan(bf16)
        res["bf16 kernel only (planned launch)"] = spread(time_cuda(lambda: triton_impl.launch(prepared), 20))

        def uncached() -> None:
            triton_impl.clear_plan_cache()
            fingerprint_many(bf16)

        res["bf16 one call, plan not kept"] = spread(time_cuda(uncached, 20))
        if baseline is not None and baseline.implementation_name("cuda") == "triton":
            old = importlib.import_module("fp_baseline.triton_impl")
            res["baseline bf16 one multi-tensor call"] = spread(time_cuda(lambda: baseline.fingerprint_many(bf16), 20))
            old_plan = old.plan(bf16)
            res["baseline bf16 kernel only"] = spread(time_cuda(lambda: old.launch(old_plan), 20))
    res["bf16 per-tensor calls"] = spread(time_cuda(lambda: [fingerprint(p) for p in bf16], 5))
    res["bf16 per-tensor torch-cuda"] = spread(time_cuda(lambda: [fingerprint_torch(p) for p in bf16], 3))
    res["fp32 one multi-tensor call"] = spread(time_cuda(lambda: fingerprint_many(fp32), 20))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    idx = torch.randint(0, 50257, (16, 1024), device="cuda")
    tgt = torch.randint(0, 50257, (16, 1024), device="cuda")

    def step() -> None:
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = F.cross_entropy(model(idx).view(-1, 50257).float(), tgt.view(-1))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    res["train step (16x1024, bf16 autocast, AdamW)"] = spread(time_cuda(step, 10, warmup=3))
    step_s = res["train step (16x1024, bf16 autocast, AdamW)"]["median"]
    # What a training loop pays: the (fp32) parameters fingerprinted right after each step, with the step's
    # work still queued, timed from the step's end to the digests' return on the GPU's own timeline (pairs of
    # whole steps with and without it differ by less than the steps' own jitter).
    params = list(model.parameters())

    def after_step() -> float:
        step()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fingerprint_many(params)
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3

    for _ in range(3):
        after_step()
    res["fp32 params right after a step"] = spread([after_step() for _ in range(10)])
    # The same, queued as detlab.Recorder queues it (detlab.tensors.digests): the loop's stream pays the span from
    # the step's end to the copy of the lane sums; the host pays the submit call; the digests are read later,
    # off the loop. The synchronous figure above also holds the host's wake-up after a 75 ms wait.
    from detlab.tensors.digests import Digester

    digester = Digester()
    host: list[float] = []

    def queued_after_step() -> float:
        step()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        t0 = time.perf_counter()
        pending = digester.submit(params)
        host.append(time.perf_counter() - t0)
        end.record()
        pending.packed()
        end.synchronize()
        return start.elapsed_time(end) / 1e3

    for _ in range(3):
        queued_after_step()
    host.clear()
    res["fp32 params right after a step, queued (GPU span)"] = spread([queued_after_step() for _ in range(10)])
    res["fp32 params right after a step, queued (host submit)"] = spread(host)
    for key in ["bf16 one multi-tensor call", "bf16 per-tensor calls", "fp32 one multi-tensor call",
                "bf16 one call, plan not kept", "baseline bf16 one multi-tensor call",
                "fp32 params right after a step", "fp32 params right after a step, queued (GPU span)",
                "fp32 params right after a step, queued (host submit)"]:  # fmt: skip
        if key in res:
            res[key]["percent_of_step"] = 100 * res[key]["median"] / step_s


def bench_configs(res: dict[str, Any]) -> None:
    if implementation_name("cuda") != "triton":
        print("  (Triton unavailable: no configurations to time)")
        return
    from detlab.tensors.fingerprint import triton_impl

    x = torch.randn(GiB, device="cuda", dtype=torch.bfloat16)  # 2 GiB
    nbytes = 2 * GiB
    for block, iters, warps, prefetch in CONFIGS:
        config = triton_impl.KernelConfig(block, iters, warps, prefetch)
        name = f"block {block} x {iters}, {warps} warps{', prefetch' if prefetch else ''}"
        problem = triton_impl.check_against_reference(torch.device("cuda"), config)
        if problem is not None:
            res[name] = f"FAILED self-check: {problem}"
            continue
        res[f"{name}, end to end"] = bandwidth(
            nbytes, time_cuda(partial(triton_impl.fingerprint_many_triton, [x], config), 20)
        )
        prepared = triton_impl.plan([x], config)
        res[f"{name}, kernel only"] = bandwidth(nbytes, time_cuda(partial(triton_impl.launch, prepared), 20))


def section(name: str, fn: Callable[[dict[str, Any]], None], out: dict[str, Any]) -> None:
    print(f"\n[{name}]")
    res: dict[str, Any] = {}
    out[name] = res
    try:
        fn(res)
    except Exception as exc:  # keep going: the other sections are still worth having
        res["error"] = f"{type(exc).__name__}: {exc}"
        traceback.print_exc()
    for key, value in res.items():
        if isinstance(value, dict):
            show(key, value)
            if "percent_of_step" in value:
                print(f"  {'':<34} = {value['percent_of_step']:.3f} % of a training step")
        else:
            print(f"  {key}: {value}")
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cpu-only", action="store_true", help="only the CPU path (for machines without GPU)")
    parser.add_argument("--json", metavar="PATH", help="also write all results to PATH as JSON")
    parser.add_argument("--check", action="store_true", help="only compare implementations with numpy")
    parser.add_argument("--baseline", metavar="DIR", help="also time the package copy in DIR (before/after)")
    args = parser.parse_args()
    if args.baseline:
        global baseline
        baseline = load_baseline(args.baseline)

    gpu = torch.cuda.is_available() and not args.cpu_only
    meta = {"python": platform.python_version(), "torch": torch.__version__, "numpy": np.__version__,
            "cpu_threads": torch.get_num_threads(), "implementation_cpu": implementation_name("cpu")}  # fmt: skip
    if gpu:
        meta["device"] = torch.cuda.get_device_name()
        meta["implementation_cuda"] = implementation_name("cuda")
        try:
            import triton

            meta["triton"] = triton.__version__
        except ImportError:
            meta["triton"] = None
    print("meta:", json.dumps(meta))

    print("\n[check]")
    problems, check = run_check(full=args.check)
    for p in problems[:50]:
        print("  MISMATCH", p)
    if args.check:
        print("check:", "FAILED" if problems else "ok")
        return 1 if problems else 0

    results: dict[str, Any] = {"meta": meta, "check": check}
    section("cpu", bench_cpu, results)
    if gpu:
        section("gpu 2 GiB bf16 buffer", bench_gpu_buffer, results)
        section("gpt2-small parameters", bench_model, results)
        section("triton kernel configurations, 2 GiB bf16", bench_configs, results)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)
        print(f"\nwrote {args.json}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
