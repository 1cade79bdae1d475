"""Which part of the recorder costs the GPU-bound loop its time: variants interleaved per block in ONE process."""

import functools
import os
import queue
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "bench"))
import torch
from sdk_overhead import GpuWork, build

import detlab
from detlab.tensors.digests import read_scalar, recorded_event

dev = torch.device("cuda:0")
torch.cuda.set_device(dev)
torch.backends.cuda.matmul.allow_tf32 = True
model, opt, vocab, ctx, batch = build("gpt2-small", dev)
g = torch.Generator(device=dev).manual_seed(0)
batches = [torch.randint(0, vocab, (batch, ctx), device=dev, generator=g) for _ in range(16)]
tmp = Path(tempfile.mkdtemp())
work = GpuWork(model, "gpu_onepass")
q = queue.Queue()


def reader():
    while True:
        f = q.get()
        if f is None:
            return
        f()


threading.Thread(target=reader, daemon=True).start()
recs = {"rec_default": detlab.Recorder(out=tmp / "d"), "rec_no_drift": detlab.Recorder(out=tmp / "n", drift=False)}


def v_none(step, loss):
    pass


def v_graph(step, loss):
    work.step(step, model)


def v_copy_event(step, loss):
    read_scalar(loss)


def v_copy_event_reader(step, loss):
    q.put(read_scalar(loss))


def v_event_reader(step, loss):
    e = recorded_event()
    q.put(e.synchronize)


variants = {
    "none": v_none,
    "graph": v_graph,
    "copy_event": v_copy_event,
    "copy_event_reader": v_copy_event_reader,
    "event_reader": v_event_reader,
    **{k: functools.partial(lambda r, step, loss: r.step(step, model, loss=loss), r) for k, r in recs.items()},
}
only = sys.argv[1].split(",") if len(sys.argv) > 1 else list(variants)
variants = {k: v for k, v in variants.items() if k in only}
step = 0


def steps(n, f):
    global step
    for _ in range(n):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(batches[step % 16])
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        f(step, loss)
        step += 1


for f in variants.values():
    steps(10, f)
torch.cuda.synchronize()
time.sleep(0.2)
res = {k: [] for k in variants}
names = list(variants)
for rnd in range(int(os.environ.get("ROUNDS", 5))):
    order = names[rnd % len(names) :] + names[: rnd % len(names)]
    for k in order:
        torch.cuda.synchronize()
        time.sleep(0.1)
        t0 = time.perf_counter()
        steps(20, variants[k])
        torch.cuda.synchronize()
        res[k].append((time.perf_counter() - t0) / 20 * 1e3)
base = statistics.median(res["none"])
for k, v in res.items():
    m = statistics.median(v)
    print(f"{k:20s} {m:8.3f} ms  {100 * (m / base - 1):+.2f} %   blocks {[round(x, 2) for x in v]}")
for r in recs.values():
    r.close()
q.put(None)
