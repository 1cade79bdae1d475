"""How much host time per step the lean GPT-2 loop can add before the wall clock sees it (none mode).
Per block a busy-wait of x ms (GIL held, as Python work) at each step's end; blocks cycle through xs."""

import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "bench"))
import torch
from sdk_overhead import build

dev = torch.device("cuda:0")
torch.cuda.set_device(dev)
torch.backends.cuda.matmul.allow_tf32 = True
model, opt, vocab, ctx, batch = build("gpt2-small", dev)
g = torch.Generator(device=dev).manual_seed(0)
batches = [torch.randint(0, vocab, (batch, ctx), device=dev, generator=g) for _ in range(16)]
xs = [0, 0.25, 0.5, 1.0, 2.0, 4.0]
host = []


def steps(n, x):
    for s in range(n):
        t = time.perf_counter()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(batches[s % 16])
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        host.append(time.perf_counter() - t)
        end = time.perf_counter() + x / 1e3
        while time.perf_counter() < end:
            pass


steps(10, 0)
torch.cuda.synchronize()
res = {x: [] for x in xs}
# GPU-only time per step: events around a block after the host is far ahead is not possible; instead time
# the step with a sync per step (host+gpu serial) and GPU event time per step
for rnd in range(4):
    for x in xs if rnd % 2 == 0 else xs[::-1]:
        host.clear()
        t0 = time.perf_counter()
        steps(20, x)
        torch.cuda.synchronize()
        res[x].append((time.perf_counter() - t0) / 20 * 1e3)
        res.setdefault(f"host_{x}", []).append(statistics.median(host) * 1e3)
# GPU time of one step: events, host far behind not an issue (event elapsed measures GPU span incl. gaps)
ev = [torch.cuda.Event(enable_timing=True) for _ in range(2)]
gpu = []
for s in range(10):
    torch.cuda.synchronize()
    ev[0].record()
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = model(batches[s % 16])
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    ev[1].record()
    torch.cuda.synchronize()
    gpu.append(ev[0].elapsed_time(ev[1]))
out = {str(k): statistics.median(v) for k, v in res.items()}
out["gpu_span_sync_each_step"] = statistics.median(gpu)
base = statistics.median(res[0])
for x in xs:
    print(
        f"busy {x:5.2f} ms/step: wall {statistics.median(res[x]):.3f} ms (+{statistics.median(res[x]) - base:.3f}); "
        f"host's loop (launch calls, no wait) {out['host_' + str(x)]:.3f} ms; blocks {[round(v, 2) for v in res[x]]}"
    )
print("GPU span of a step with a sync before it:", out["gpu_span_sync_each_step"])
