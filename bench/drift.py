"""What the drift statistics and sketches (detlab.core.sketch, detlab.tensors.drift) cost on GPT-2-small training,
against the digests-only recorder in the same run.

Interleaved blocks of training steps (A B C C B A ...), one mode per block:
  baseline   the training step alone;
  digests    + detlab.Recorder(drift=False): digests only (the comparison point);
  drift      + detlab.Recorder() (digests and drift: the default).
Each block is timed with CUDA events (wall clock on CPU) and divided by its steps; medians and quartiles over
blocks. Also: the sketch pass alone on the model's parameters (CUDA events, after warm-up) beside the fingerprint
alone, and checks that the device's sketch equals the CPU's (float64, up to summation order) and that two
passes on the device agree bit for bit.

GPT-2-small (124M parameters, fp32 weights, bf16 autocast) is built from a config (transformers; no download).

    python bench/drift.py [--cpu] [--rounds 6] [--block 20] [--json PATH]
    python bench/drift.py --cpu --rounds 2 --block 2 --layers 2 --embd 128 --seq 64   # a CPU smoke test
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from transformers import GPT2Config, GPT2LMHeadModel

import detlab
from detlab.core import sketch
from detlab.tensors import fingerprint as fp
from detlab.tensors.drift import Sketcher

MODES = ("baseline", "digests", "drift")


def gpt2(layers: int, embd: int, heads: int, device: torch.device) -> torch.nn.Module:
    torch.manual_seed(0)
    model: torch.nn.Module = GPT2LMHeadModel(GPT2Config(n_layer=layers, n_embd=embd, n_head=heads, n_positions=1024))
    return model.to(device)


class Clock:
    """Elapsed seconds of queued work: CUDA events on a GPU, the wall clock on CPU."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"

    def time(self, work: Callable[[], None]) -> float:
        if not self.cuda:
            t0 = time.perf_counter()
            work()
            return time.perf_counter() - t0
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        start.record()
        work()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3


def summary(values: list[float]) -> dict[str, float]:
    q = statistics.quantiles(values, n=4) if len(values) > 1 else [values[0]] * 3
    return {"median_ms": statistics.median(values) * 1e3, "q1_ms": q[0] * 1e3, "q3_ms": q[2] * 1e3,
            "blocks": len(values)}


def training(args: argparse.Namespace, device: torch.device, out: Path) -> dict[str, Any]:
    model = gpt2(args.layers, args.embd, args.heads, device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    recorders = {"digests": detlab.Recorder(out=out / "digests", drift=False),
                 "drift": detlab.Recorder(out=out / "drift")}
    clock = Clock(device)
    step = 0

    def block(mode: str, n: int) -> None:
        nonlocal step
        for _ in range(n):
            g = torch.Generator(device=device).manual_seed(step)
            ids = torch.randint(0, 50257, (args.batch, args.seq), device=device, generator=g)
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
                loss = model(input_ids=ids, labels=ids).loss
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            if mode in recorders:
                recorders[mode].step(step, model, loss=loss)
            step += 1

    times: dict[str, list[float]] = {m: [] for m in MODES}
    for mode in MODES:  # warm-up: allocator, plans, the recorders' first records
        block(mode, 3)
    for r in range(args.rounds):
        for mode in (MODES if r % 2 == 0 else tuple(reversed(MODES))):
            times[mode].append(clock.time(functools.partial(block, mode, args.block)) / args.block)
    for rec in recorders.values():
        rec.close()
    base, digests, drift = (statistics.median(times[m]) for m in MODES)
    return {"per_mode": {m: summary(v) for m, v in times.items()},
            "digests_pct_of_step": (digests / base - 1) * 100, "drift_pct_of_step": (drift / base - 1) * 100,
            "drift_over_digests_pct_of_step": (drift - digests) / base * 100,
            "per_round_drift_over_digests_pct": [
                (c - b) / a * 100 for a, b, c in zip(times["baseline"], times["digests"], times["drift"], strict=True)]}


def passes(model_params: list[torch.Tensor], device: torch.device, repeats: int) -> dict[str, Any]:
    """The sketch pass (and, on a GPU, the torch pass it replaces there) and the fingerprint alone on the same
    parameters, and what they read."""
    clock, sketcher = Clock(device), Sketcher()
    indices = list(range(len(model_params)))
    torch_pass = lambda: sketcher._compute(model_params, indices, device)  # noqa: E731
    for _ in range(2):
        sketcher.submit(model_params)()
        torch_pass()
        fp.fingerprint_many(model_params)
    sk = [clock.time(lambda: sketcher.submit(model_params)) for _ in range(repeats)]
    tp = [clock.time(torch_pass) for _ in range(repeats)]
    fps = [clock.time(lambda: fp.fingerprint_many(model_params)) for _ in range(repeats)]
    return {"sketch": summary(sk), "sketch_torch_pass": summary(tp), "fingerprint": summary(fps),
            "bytes": sum(p.nbytes for p in model_params), "fingerprint_impl": fp.implementation_name(device)}


def checks(model_params: list[torch.Tensor], device: torch.device) -> dict[str, Any]:
    here = Sketcher().submit(model_params)()
    again = Sketcher().submit(model_params)()
    cpu = Sketcher().submit([p.detach().cpu() for p in model_params])()
    assert here is not None and cpu is not None
    a, b = sketch.unpack_sketch(here[1]), sketch.unpack_sketch(cpu[1])
    sa, sb = sketch.unpack_stats(here[0]), sketch.unpack_stats(cpu[0])
    tiny = 1e-300
    return {"device_passes_bit_equal": here == again,
            "max_sketch_difference_vs_cpu_relative_to_norm":
                float(np.max(np.abs(a - b) / np.maximum(sb[:, 1:2], tiny))),
            "stats_max_relative_difference_vs_cpu": float(np.max(np.abs(sa - sb) / np.maximum(np.abs(sb), tiny)))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cpu", action="store_true", help="run on CPU (a smoke test) even where CUDA is available")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--block", type=int, default=20)
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--embd", type=int, default=768)
    parser.add_argument("--heads", type=int, default=12)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=1024)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    device = torch.device("cpu" if args.cpu or not torch.cuda.is_available() else "cuda")
    print("device", torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu", "torch", torch.__version__,
          flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        model = {k: v for k, v in vars(args).items() if k != "json"}
        result: dict[str, Any] = {"device": device.type, "model": model, "sketch": {"version": sketch.VERSION,
                                  "k": sketch.K, "bytes_per_tensor": sketch.STAT_BYTES + sketch.SKETCH_BYTES}}
        params = [p.detach() for p in gpt2(args.layers, args.embd, args.heads, device).parameters()]
        result["params"], result["tensors"] = sum(p.numel() for p in params), len(params)
        result["record_bytes"] = {"digests": 16 * len(params),
                                  "drift": (sketch.STAT_BYTES + sketch.SKETCH_BYTES) * len(params)}
        result["checks"] = checks(params, device)
        print(json.dumps(result["checks"]), flush=True)
        result["passes"] = passes(params, device, repeats=max(3, args.rounds))
        print(json.dumps(result["passes"]), flush=True)
        del params
        result["training"] = training(args, device, Path(tmp))
    print(json.dumps(result, indent=1))
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
