"""Process-level split of the recorder's cost: one process per mode, interleaved rounds (as bench/sdk_overhead.py)."""

import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

MODES = ["none", "import", "warm", "default", "no_drift", "graph"]


def child(mode, tmp):
    sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "bench"))
    import torch
    from sdk_overhead import GpuWork, build

    dev = torch.device("cuda:0")
    torch.cuda.set_device(dev)
    torch.backends.cuda.matmul.allow_tf32 = True
    model, opt, vocab, ctx, batch = build("gpt2-small", dev)
    g = torch.Generator(device=dev).manual_seed(0)
    batches = [torch.randint(0, vocab, (batch, ctx), device=dev, generator=g) for _ in range(16)]
    rec = None
    if mode in ("import", "warm", "default", "no_drift"):
        import detlab

        rec = detlab.Recorder(out=Path(tmp) / f"{mode}-{time.time_ns()}", drift=mode != "no_drift")
    if mode == "graph":
        rec = GpuWork(model, "gpu_onepass")
    step = 0

    def steps(n, record):
        nonlocal step
        for _ in range(n):
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = model(batches[step % 16])
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            if record:
                rec.step(step, model, loss=loss)
            step += 1

    steps(10, mode in ("warm", "default", "no_drift", "graph"))
    torch.cuda.synchronize()
    blocks = []
    for _ in range(4):
        t0 = time.perf_counter()
        steps(20, mode in ("default", "no_drift", "graph"))
        torch.cuda.synchronize()
        blocks.append((time.perf_counter() - t0) / 20 * 1e3)
    # The model's own step alone on the GPU (no recorder call inside), a sync before: are its kernels slower here?
    ev = [torch.cuda.Event(enable_timing=True) for _ in range(2)]
    span = []
    for s in range(12):
        torch.cuda.synchronize()
        ev[0].record()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(batches[s % 16])
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        ev[1].record()
        torch.cuda.synchronize()
        span.append(ev[0].elapsed_time(ev[1]))
    if hasattr(rec, "close"):
        rec.close()
    print(json.dumps([statistics.median(span[2:])] + blocks))


if len(sys.argv) > 2:
    child(sys.argv[1], sys.argv[2])
    sys.exit()
res = {m: [] for m in MODES}
spans = {}
with tempfile.TemporaryDirectory() as tmp:
    for r in range(3):
        order = MODES[2 * r % 6 :] + MODES[: 2 * r % 6]
        for m in order:
            out = subprocess.run([sys.executable, __file__, m, tmp], capture_output=True, text=True)
            if out.returncode:
                print(out.stderr[-3000:])
                sys.exit(1)
            sp, *b = json.loads(out.stdout.strip().splitlines()[-1])
            res[m].append(statistics.median(b))
            spans.setdefault(m, []).append(sp)
            print(
                r,
                m,
                round(statistics.median(b), 3),
                [round(x, 2) for x in b],
                "model's GPU span",
                round(sp, 3),
                flush=True,
            )
base = statistics.median(res["none"])
for m, v in res.items():
    print(
        f"{m:10s} {statistics.median(v):.3f} ms {100 * (statistics.median(v) / base - 1):+.2f} %  "
        f"per proc {[round(x, 3) for x in v]}; model's span {statistics.median(spans[m]):.3f}"
    )
