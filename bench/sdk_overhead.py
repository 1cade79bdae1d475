"""On a CUDA GPU: (1) the recorder's asynchronous digests equal synchronous ones even when the tensors are
changed in place right after rec.grads / rec.step on a busy stream; (2) overhead on GPT-2-small training,
interleaved blocks (baseline, recorder, synchronous fingerprint_many), CUDA-event timed; medians and
quartiles over blocks. Needs transformers (for the model, built from a config: no download).

    python bench/sdk_overhead.py OUT_DIR ROUNDS BLOCK     # e.g. OUT_DIR 6 20; writes OUT_DIR/sdk_gpu.json
"""

from __future__ import annotations

import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
from transformers import GPT2Config, GPT2LMHeadModel

import detlab
from detlab.sdk import load_run
from detlab.tensors.fingerprint import FP_VERSION, fingerprint_many, implementation_name

dev = torch.device("cuda", 0)
print("device", torch.cuda.get_device_name(dev), "torch", torch.__version__, "impl", implementation_name(dev))


def gpt2(layers: int, embd: int, heads: int) -> torch.nn.Module:
    torch.manual_seed(0)
    cfg = GPT2Config(n_layer=layers, n_embd=embd, n_head=heads, n_positions=1024)
    return GPT2LMHeadModel(cfg).to(dev)


def batch(step: int, b: int, t: int) -> torch.Tensor:
    g = torch.Generator(device=dev).manual_seed(step)
    return torch.randint(0, 50257, (b, t), device=dev, generator=g)


def lm_step(model: torch.nn.Module, opt: torch.optim.Optimizer, ids: torch.Tensor) -> torch.Tensor:
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = model(input_ids=ids, labels=ids).loss
    opt.zero_grad(set_to_none=True)
    loss.backward()
    return loss


# ---- (1) correctness -----------------------------------------------------------------------------------
def correctness(out: Path) -> dict:
    model = gpt2(2, 256, 4)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    big = torch.randn(8192, 8192, device=dev)
    expected = {}
    with detlab.Recorder(out=out, grads=True, optimizer=opt, buffers=True) as rec:
        for step in range(8):
            loss = lm_step(model, opt, batch(step, 4, 256))
            grads = [p.grad for p in model.parameters()]
            want_g = fingerprint_many(grads)  # synchronous
            _ = big @ big  # keep the stream busy so the recorder's launch is still queued below
            rec.grads(step, model)
            for g in grads:
                g.mul_(0.5)  # in place, queued after rec.grads: must not be in the recorded digests
            opt.step()
            named = [(n, p) for n, p in model.named_parameters()] + list(model.named_buffers())
            state = [t for _, t in named] + [v for p in model.parameters() for _, v in sorted(opt.state[p].items())
                                             if isinstance(v, torch.Tensor)]
            want_s = fingerprint_many(state)
            _ = big @ big
            rec.step(step, model, loss=loss)
            with torch.no_grad():
                for p in model.parameters():
                    p.add_(1e-3)  # queued after rec.step: must not be seen either
            expected[step] = want_s + want_g
    lines = [json.loads(x) for x in (out / "rank0.jsonl").read_text().splitlines()]
    steps = {r["step"]: r for r in lines if r["type"] == "step"}
    bad = []
    for step, want in expected.items():
        got = [f"{FP_VERSION}:" + steps[step]["digests"][32 * i: 32 * i + 32] for i in range(len(want))]
        if got != want:
            bad.append(step)
    env = lines[0]
    return {"steps": len(steps), "tensors": len(expected[0]), "mismatched_steps": bad,
            "env": {k: env[k] for k in ("device", "driver", "cuda", "torch", "nccl", "fingerprint_impl")}}


# ---- (2) overhead ------------------------------------------------------------------------------------
def overhead(out: Path, rounds: int, block: int) -> dict:
    model = gpt2(12, 768, 12)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    params = [p.detach() for p in model.parameters()]
    rec = detlab.Recorder(out=out)
    times: dict[str, list[float]] = {"baseline": [], "recorder": [], "sync": []}
    host: list[float] = []
    step = 0

    def run(mode: str, n: int, timed: bool) -> None:
        nonlocal step
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        start.record()
        for _ in range(n):
            loss = lm_step(model, opt, batch(step, 8, 1024))
            opt.step()
            if mode == "recorder":
                t0 = time.perf_counter()
                rec.step(step, model, loss=loss)
                if timed:
                    host.append(time.perf_counter() - t0)
            elif mode == "sync":
                fingerprint_many(params)
            step += 1
        end.record()
        end.synchronize()
        if timed:
            times[mode].append(start.elapsed_time(end) / n)

    for mode in times:  # warm-up: compile, autotune, plans
        run(mode, 5, False)
    for r in range(rounds):
        order = list(times) if r % 2 == 0 else list(reversed(times))
        for mode in order:
            run(mode, block, True)
    # rec.step's own host time, with the GPU idle and the writer caught up (no back-pressure in it)
    idle: list[float] = []
    for _ in range(30):
        loss = lm_step(model, opt, batch(step, 8, 1024))
        opt.step()
        torch.cuda.synchronize()
        while not rec._spool._jobs.empty():
            time.sleep(0.001)
        time.sleep(0.005)
        t0 = time.perf_counter()
        rec.step(step, model, loss=loss)
        idle.append(time.perf_counter() - t0)
        step += 1
    rec.close()

    def summary(v: list[float]) -> dict:
        q = statistics.quantiles(v, n=4)
        return {"median_ms": statistics.median(v), "q1": q[0], "q3": q[2], "blocks": len(v)}

    base = statistics.median(times["baseline"])
    return {
        "model_params": sum(p.numel() for p in params), "tensors": len(params), "batch": [8, 1024],
        "per_mode": {m: summary(v) for m, v in times.items()},
        "overhead_recorder_pct": (statistics.median(times["recorder"]) / base - 1) * 100,
        "overhead_sync_pct": (statistics.median(times["sync"]) / base - 1) * 100,
        "per_block_overhead_recorder_pct": [(a / b - 1) * 100
                                            for a, b in zip(times["recorder"], times["baseline"], strict=True)],
        "rec_step_host_us": {"median": statistics.median(host) * 1e6,
                             "p90": statistics.quantiles(host, n=10)[8] * 1e6},
        "rec_step_host_us_idle_gpu": {"median": statistics.median(idle) * 1e6,
                                      "q1": statistics.quantiles(idle, n=4)[0] * 1e6,
                                      "q3": statistics.quantiles(idle, n=4)[2] * 1e6},
        "steps_recorded": len(load_run(out).steps()),
    }


if __name__ == "__main__":
    outdir = Path(sys.argv[1])
    outdir.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp())
    result = {"correctness": correctness(tmp / "c")}
    print(json.dumps(result), flush=True)
    result["overhead"] = overhead(tmp / "o", rounds=int(sys.argv[2]), block=int(sys.argv[3]))
    print(json.dumps(result, indent=1))
    (outdir / "sdk_gpu.json").write_text(json.dumps(result, indent=1))
