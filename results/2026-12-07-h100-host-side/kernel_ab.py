"""A/B of the one-pass kernel on GPT-2 small's fp32 parameters: .sum(), fp2 alone, old one-pass, new one-pass,
and a sweep of the new kernel's float32 layout (chunk, rows a tile, warps). CUDA events, graph replays."""

import importlib.util
import json
import os
import statistics
import sys

import numpy as np
import torch

sys.path.insert(0, os.getcwd())
from bench.onepass import gpt2_small_shapes
from detlab.tensors import onepass_triton as new
from detlab.tensors.fingerprint import triton_impl

spec = importlib.util.spec_from_file_location("onepass_old", "scratch/onepass_old.py")
old = importlib.util.module_from_spec(spec)
sys.modules["onepass_old"] = old
spec.loader.exec_module(old)


def time_ms(fn, reps=50, rounds=9):
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    runs = []
    for _ in range(rounds):
        a.record()
        for _ in range(reps):
            fn()
        b.record()
        b.synchronize()
        runs.append(a.elapsed_time(b) / reps)
    return round(statistics.median(runs) * 1000, 1), round(min(runs) * 1000, 1), round(max(runs) * 1000, 1)


def graph_of(mod, ts):
    p = mod.plan(ts, range(len(ts)))
    s = mod._new_slot(p)
    for _ in range(2):
        mod.run(p, s)
    assert s.graph is not None
    return p, s


dev = torch.device("cuda", 0)
g = torch.Generator(dev).manual_seed(0)
ts = [torch.randn(s, device=dev, generator=g) for s in gpt2_small_shapes()]
flat = torch.randn(sum(t.numel() for t in ts), device=dev, generator=g)
out = {"device": torch.cuda.get_device_name(0), "bytes": int(flat.numel() * 4)}
fp = triton_impl.plan(ts)
po, so = graph_of(old, ts)
pn, sn = graph_of(new, ts)
torch.cuda.synchronize()
do, vo = old.read(po, so)
dn, vn = new.read(pn, sn)
out["digests_equal"] = do == dn
out["values_max_rel"] = float(np.max(np.abs(vo - vn) / np.maximum(np.abs(vo), 1e-300)))
res = {}
for _ in range(3):  # interleaved rounds
    for name, fn in [
        ("sum", lambda: flat.sum()),
        ("fp2", lambda: triton_impl.launch(fp)),
        ("onepass_old", lambda: so.graph.replay()),
        ("onepass_new", lambda: sn.graph.replay()),
    ]:
        res.setdefault(name, []).append(time_ms(fn))
out["us_median_min_max_per_round"] = res
print(json.dumps(out, indent=1), flush=True)
sweep = {}
base = dict(new.KINDS)
for chunk, tile, warps in [
    (1024, 2, 4),
    (1024, 4, 4),
    (1024, 1, 4),
    (2048, 2, 8),
    (1024, 2, 8),
    (512, 2, 2),
    (512, 4, 2),
    (2048, 1, 8),
    (1024, 4, 8),
]:
    new.KINDS[torch.float32] = (*base[torch.float32][:3], chunk, tile)
    new.NUM_WARPS = warps
    try:
        p, s = graph_of(new, ts)
        torch.cuda.synchronize()
        d, v = new.read(p, s)
        ok = d == dn and bool(np.allclose(v, vn, rtol=1e-12, atol=1e-12))
        sweep[f"chunk{chunk}_tile{tile}_warps{warps}"] = (time_ms(s.graph.replay), ok)
    except Exception as e:
        sweep[f"chunk{chunk}_tile{tile}_warps{warps}"] = repr(e)[:300]
    print(list(sweep.items())[-1], flush=True)
new.KINDS[torch.float32] = base[torch.float32]
new.NUM_WARPS = 4
out["sweep_float32"] = sweep
with open(os.path.join(os.environ.get("OUT", "/tmp"), "kexp.json"), "w") as f:
    json.dump(out, f, indent=1)
