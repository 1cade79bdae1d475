"""Host cost of each torch call rec.step makes, in isolation (no writer thread), GPU kept busy by _sleep."""

import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "bench"))
import torch
from sdk_overhead import build

from detlab.tensors import digests, named
from detlab.tensors import onepass_triton as ot

cuda = torch.cuda.is_available()
dev = torch.device("cuda:0" if cuda else "cpu")
model, opt, vocab, ctx, batch = build("gpt2-small" if cuda else "tiny", dev)
tensors = [p.detach() for p in model.parameters()]
loss = torch.ones((), device=dev, requires_grad=True) * 2.0
mt = named.ModelTensors(model)


def busy():
    if cuda:
        torch.cuda._sleep(10_000_000)


def t(name, f, n=2000):
    busy()
    f()
    times = []
    for _ in range(5):
        busy()
        s = time.perf_counter()
        for _ in range(n // 5):
            f()
        times.append((time.perf_counter() - s) / (n // 5) * 1e6)
    if cuda:
        torch.cuda.synchronize()
    print(f"{name:50s} {statistics.median(times):8.2f} us  ({min(times):.2f}-{max(times):.2f})")


t("ListKey(148)", lambda: named.ListKey(tensors), 500)
t("ModelTensors.parameters()", lambda: mt.parameters(), 500)
k = named.ListKey(tensors)
k2 = named.ListKey(tensors)
t("ListKey == ListKey", lambda: k == k2, 2000)
if cuda:
    t("torch.cuda.device ctx", lambda: torch.cuda.device(dev).__enter__() or None)

    def ctx():
        with torch.cuda.device(dev):
            pass

    t("with torch.cuda.device(dev)", ctx)
    t("torch.empty((), pinned)", lambda: torch.empty((), dtype=torch.float32, pin_memory=True))
    host = torch.empty((), dtype=torch.float32, pin_memory=True)
    t("host.copy_(loss bf16->f32, non_blocking)", lambda: host.copy_(loss.detach(), non_blocking=True))

    def cp():
        with torch.no_grad():
            host.copy_(loss, non_blocking=True)

    t("no_grad + copy_", cp)
    t("Event(blocking).record()", lambda: torch.cuda.Event(blocking=True).record())
    ev = torch.cuda.Event(blocking=True)
    t("reused event.record()", lambda: ev.record())
    t("read_scalar(loss)", lambda: digests.read_scalar(loss))
    p = ot.plan(tensors, range(len(tensors)))
    s = ot._new_slot(p)
    ot.run(p, s)
    ot.run(p, s)
    ot.run(p, s)
    print("graph:", s.graph is not None)
    t("onepass run (graph replay)", lambda: ot.run(p, s), 500)
    runner = ot.OnePass()

    def sub():
        r = runner.submit(tensors, k)
        return r

    acc = []
    for _ in range(60):
        busy()
        s0 = time.perf_counter()
        r = runner.submit(tensors, k)
        acc.append(time.perf_counter() - s0)
        torch.cuda.synchronize()
        r()
    print(f"{'OnePass.submit (slot, replay, event)':50s} {statistics.median(acc[10:]) * 1e6:8.2f} us")
    t("torch.cuda.current_stream()", lambda: torch.cuda.current_stream())
    t("nothing (lambda)", lambda: None)
