"""Does a writer-like thread's GIL time cost the GPU-bound loop? One process per mode, interleaved rounds."""

import json
import queue
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

MODES = ["none", "no_drift", "no_drift_nogc", "default", "default_nogc"]


def child(mode, tmp):
    sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "bench"))
    import torch
    from sdk_overhead import build

    dev = torch.device("cuda:0")
    torch.cuda.set_device(dev)
    torch.backends.cuda.matmul.allow_tf32 = True
    model, opt, vocab, ctx, batch = build("gpt2-small", dev)
    g = torch.Generator(device=dev).manual_seed(0)
    batches = [torch.randint(0, vocab, (batch, ctx), device=dev, generator=g) for _ in range(16)]
    rec = None
    q = queue.Queue(maxsize=4)
    hold = 0.3e-3 if mode == "thread_gil" else 0.0

    def worker():
        while (e := q.get()) is not None:
            e.synchronize()
            until = time.perf_counter() + hold
            while time.perf_counter() < until:
                pass

    if mode.startswith("thread"):
        threading.Thread(target=worker, daemon=True).start()
    if mode != "none":
        import detlab

        rec = detlab.Recorder(out=Path(tmp) / f"{mode}-{time.time_ns()}", drift=not mode.startswith("no_drift"))
    import gc

    gcs = {"t": 0.0, "n": [0, 0, 0], "start": 0.0}

    def cb(phase, info):
        if phase == "start":
            gcs["start"] = time.perf_counter()
        else:
            gcs["t"] += time.perf_counter() - gcs["start"]
            gcs["n"][info["generation"]] += 1

    gc.callbacks.append(cb)
    step = 0

    def steps(n):
        nonlocal step
        for _ in range(n):
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = model(batches[step % 16])
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            if rec is not None:
                rec.step(step, model, loss=loss)
            if mode.startswith("thread"):
                e = torch.cuda.Event(blocking=True)
                e.record()
                q.put(e)
            step += 1

    steps(10)
    torch.cuda.synchronize()
    if mode.endswith("nogc"):
        gc.disable()
    gcs["t"] = 0.0
    gcs["n"] = [0, 0, 0]
    blocks = []
    for _ in range(5):
        t0 = time.perf_counter()
        steps(20)
        torch.cuda.synchronize()
        blocks.append((time.perf_counter() - t0) / 20 * 1e3)
    if rec is not None:
        rec.close()
    print(
        f"gc per step: {gcs['t'] / 100 * 1e3:.3f} ms, collections by generation in 100 steps {gcs['n']}",
        file=sys.stderr,
    )
    print(json.dumps(blocks))


if len(sys.argv) > 2:
    child(sys.argv[1], sys.argv[2])
    sys.exit()
res = {m: [] for m in MODES}
with tempfile.TemporaryDirectory() as tmp:
    for r in range(3):
        order = MODES[2 * r % 5 :] + MODES[: 2 * r % 5]
        for m in order:
            out = subprocess.run([sys.executable, __file__, m, tmp], capture_output=True, text=True)
            if out.returncode:
                print(out.stderr[-3000:])
                sys.exit(1)
            b = json.loads(out.stdout.strip().splitlines()[-1])
            res[m].append(statistics.median(b))
            print(
                r,
                m,
                round(statistics.median(b), 3),
                [round(x, 2) for x in b],
                out.stderr.strip().splitlines()[-1:],
                flush=True,
            )
base = statistics.median(res["none"])
for m, v in res.items():
    print(
        f"{m:12s} {statistics.median(v):.3f} ms {100 * (statistics.median(v) / base - 1):+.2f} %  "
        f"per proc {[round(x, 3) for x in v]}"
    )
