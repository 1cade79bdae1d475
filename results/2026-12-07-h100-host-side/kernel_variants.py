"""Variants of the one-pass kernel on GPT-2 small's fp32 parameters (H100/H200): CUDA events, graph replays,
interleaved rounds. Each variant is a copy of a module's source with a substitution, loaded as its own module."""

import importlib.util
import json
import os
import statistics
import sys
import tempfile

import numpy as np
import torch

sys.path.insert(0, os.getcwd())
from bench.onepass import gpt2_small_shapes
from detlab.tensors.fingerprint import triton_impl

OLD = open("scratch/onepass_old.py").read()
TREE = open("detlab/tensors/onepass_triton.py").read()
LOOP = "for i in range(0, count, ROW_TILE):"
EPI = "        tl.store(o + (k + rot) % K, tl.sum(tl.where(bucket == k, signed, 0.0), axis=0))"
NOEPI = "        tl.store(o + k, tl.sum(signed, axis=0))" if False else "        pass"
EPI_FOR = "    for k in tl.static_range(K):\n" + EPI
NOEPI_FOR = "    tl.store(o, tl.sum(signed, axis=0))"
tmp = tempfile.mkdtemp()


def load(name, src):
    path = os.path.join(tmp, name + ".py")
    open(path, "w").write(src)
    spec = importlib.util.spec_from_file_location(name, path)
    m = importlib.util.module_from_spec(spec)
    sys.modules[name] = m
    spec.loader.exec_module(m)
    return m


ONLY = sys.argv[1:]
V = {
    "old": (OLD, None, 4),
    "tree": (TREE, None, 4),
    "tree_tile1": (TREE, 1, 4),
    "tree_tile4": (TREE, 4, 4),
    "tree_w8": (TREE, 2, 8),
    "old_stages2": (OLD.replace(LOOP, "for i in tl.range(0, count, ROW_TILE, num_stages=2):"), None, 4),
    "old_stages3": (OLD.replace(LOOP, "for i in tl.range(0, count, ROW_TILE, num_stages=3):"), None, 4),
    "old_noepi": (OLD.replace(EPI_FOR, NOEPI_FOR), None, 4),
    "old_nohash": (
        OLD.replace("_mix(word ^ key0, A1, A2, A3, A4, A5)", "(word ^ key0)").replace(
            "_mix(word ^ key1, B1, B2, B3, B4, B5)", "(word ^ key1)"
        ),
        None,
        4,
    ),
    "old_nostats": (
        OLD.replace("        total += tl.sum(tl.sum(grouped, axis=2), axis=0)\n", "")
        .replace("        squares += tl.sum(tl.sum(grouped * grouped, axis=2), axis=0)\n", "")
        .replace(
            "        peak = tl.maximum(peak, tl.max(tl.max(tl.reshape(tl.abs(x), [ROW_TILE, GROUPS, G]), axis=2), "
            "axis=0).to(PEAK))\n",
            "",
        ),
        None,
        4,
    ),
    "old_noacc": (OLD.replace("        acc += tl.sum(wide * sign[:, None], axis=0)\n", ""), None, 4),
    "old_nof64": (
        OLD.replace("        acc += tl.sum(wide * sign[:, None], axis=0)\n", "")
        .replace("        total += tl.sum(tl.sum(grouped, axis=2), axis=0)\n", "")
        .replace("        squares += tl.sum(tl.sum(grouped * grouped, axis=2), axis=0)\n", ""),
        None,
        4,
    ),
    "old_nowords": (
        OLD.replace(
            "        word = _words(bits, ROW_TILE, CHUNK, PER)\n",
            "        word = tl.zeros([ROW_TILE, CHUNK // PER], dtype=tl.uint64) "
            "+ tl.sum(bits, axis=1).to(tl.uint64)[:, None]\n",
        ),
        None,
        4,
    ),
}


def regs(name, m):
    try:
        for dev_cache in m._onepass_kernel.device_caches.values():
            for k in dev_cache[0].values():
                k._init_handles()
                ir = k.asm.get("ttgir", "")
                print(
                    "  regs",
                    name,
                    k.n_regs,
                    "spills",
                    k.n_spills,
                    "shared",
                    k.metadata.shared,
                    "cvt_layout",
                    ir.count("convert_layout"),
                    "local_alloc",
                    ir.count("local_alloc"),
                    flush=True,
                )
                if name == "old":
                    open(os.path.join(os.environ.get("OUT", "/tmp"), f"old_{k.n_regs}.ttgir"), "w").write(ir)
    except Exception as e:
        print("  regs?", name, repr(e)[:200])


for n, (src, _, _) in V.items():
    assert n in ("old", "tree", "tree_tile1", "tree_tile4", "tree_w8") or src not in (OLD, TREE), n


def time_ms(fn, reps=50, rounds=7):
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
    return round(statistics.median(runs) * 1000, 1)


dev = torch.device("cuda", 0)
g = torch.Generator(dev).manual_seed(0)
ts = [torch.randn(s, device=dev, generator=g) for s in gpt2_small_shapes()]
flat = torch.randn(sum(t.numel() for t in ts), device=dev, generator=g)
fp = triton_impl.plan(ts)
out = {"device": torch.cuda.get_device_name(0), "bytes": int(flat.numel() * 4), "check": {}, "us": {}}
fns = {"sum": lambda: flat.sum(), "fp2": lambda: triton_impl.launch(fp)}
ref = None
KEEP = []
for name, (src, tile, warps) in V.items():
    if ONLY and name not in ONLY:
        continue
    try:
        m = load(name, src)
        if tile:
            m.KINDS[torch.float32] = (*m.KINDS[torch.float32][:4], tile)
        m.NUM_WARPS = warps
        p = m.plan(ts, range(len(ts)))
        s = m._new_slot(p)
        for _ in range(2):
            m.run(p, s)
        torch.cuda.synchronize()
        d, v = m.read(p, s)
        if ref is None:
            ref = (d, v)
        out["check"][name] = [d == ref[0], bool(np.allclose(v, ref[1], rtol=1e-12, atol=1e-12))]
        fns[name] = s.graph.replay
        KEEP.append((m, p, s))
        regs(name, m)
    except Exception as e:
        out["check"][name] = repr(e)[:400]
    print(name, out["check"][name], flush=True)
for rnd in range(3):
    for name, fn in fns.items():
        if rnd == 0:
            print("timing", name, flush=True)
        out["us"].setdefault(name, []).append(time_ms(fn))
for name, v in out["us"].items():
    print(f"{name:12s} {statistics.median(v):7.1f} us  {v}")
json.dump(out, open(os.path.join(os.environ.get("OUT", "/tmp"), "kexp2.json"), "w"), indent=1)
