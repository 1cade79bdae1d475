"""Which lane mixer can reach the read bandwidth of `.sum()`? Times fp1's kernel structure with other mixers.

Each variant is the fp1 Triton kernel (two lanes, word j keyed by `j * G_k`, lane sums by atomic add) with a
different pair of mixers, on one 2 GiB buffer whose size is a whole number of tiles (no tail code). Printed
beside them, from the same run: a variant that adds the keyed words without mixing (the kernel's own read
ceiling), `float32 .sum()` and `torch.hash_tensor` over the same bytes. The choice of fp2's mixer rests on
this run (results/2026-12-01-h200-fp2/).

    python3 bench/fp_mixers.py [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys

import torch
import triton
import triton.language as tl

GiB = 1 << 30
BLOCK, ITERS = 512, 32

# name -> (lane 0 mixer, lane 1 mixer); a mixer is (s1, m1, s2, m2, s3): z ^= z >> s1; z *= m1; z ^= z >> s2;
# z *= m2; z ^= z >> s3 (m2 = 0: stop after the first multiply's xorshift s2). None: no mixing at all.
VARIANTS: dict[str, tuple | None] = {
    "fp1 (splitmix64, fmix64)": ((30, 0xBF58476D1CE4E5B9, 27, 0x94D049BB133111EB, 31),
                                 (33, 0xFF51AFD7ED558CCD, 33, 0xC4CEB9FE1A85EC53, 33)),
    "two multiplies, shifts 32-29-32": ((32, 0xBF58476D1CE4E5B9, 29, 0x94D049BB133111EB, 32),
                                        (32, 0xFF51AFD7ED558CCD, 29, 0xC4CEB9FE1A85EC53, 32)),
    "one multiply, shifts 32-32": ((32, 0xBF58476D1CE4E5B9, 32, 0, 0), (32, 0xFF51AFD7ED558CCD, 32, 0, 0)),
    "one multiply, shifts 32-29": ((32, 0xBF58476D1CE4E5B9, 29, 0, 0), (32, 0xFF51AFD7ED558CCD, 29, 0, 0)),
    "no mixing (read ceiling)": None,
}  # fmt: skip


@triton.jit
def _mix(z, S1: tl.constexpr, M1: tl.constexpr, S2: tl.constexpr, M2: tl.constexpr, S3: tl.constexpr):
    z = z ^ (z >> S1)
    z = z * M1
    z = z ^ (z >> S2)
    if M2 != 0:
        z = z * M2
        z = z ^ (z >> S3)
    return z


@triton.jit
def _kernel(x, sums, A1: tl.constexpr, A2: tl.constexpr, A3: tl.constexpr, A4: tl.constexpr, A5: tl.constexpr,
            B1: tl.constexpr, B2: tl.constexpr, B3: tl.constexpr, B4: tl.constexpr, B5: tl.constexpr,
            MIX: tl.constexpr, BLOCK: tl.constexpr, ITERS: tl.constexpr):  # fmt: skip
    pid = tl.program_id(0)
    first = pid.to(tl.int64) * (BLOCK * ITERS)
    lanes = tl.arange(0, BLOCK)
    pos = (first + lanes).to(tl.uint64, bitcast=True)
    key0 = pos * 0x9E3779B97F4A7C15
    key1 = pos * 0xD1B54A32D192ED03
    acc0 = tl.zeros([BLOCK], dtype=tl.uint64)
    acc1 = tl.zeros([BLOCK], dtype=tl.uint64)
    base = tl.multiple_of(x, 16)
    for it in range(0, ITERS):
        word = tl.load(base + (first + it * BLOCK + lanes)).to(tl.uint64, bitcast=True)
        if MIX:
            acc0 += _mix(word ^ key0, A1, A2, A3, A4, A5)
            acc1 += _mix(word ^ key1, B1, B2, B3, B4, B5)
        else:
            acc0 += word ^ key0
            acc1 += word ^ key1
        key0 += BLOCK * 0x9E3779B97F4A7C15 % (1 << 64)
        key1 += BLOCK * 0xD1B54A32D192ED03 % (1 << 64)
    tl.atomic_add(sums, tl.sum(acc0, axis=0).to(tl.int64, bitcast=True))
    tl.atomic_add(sums + 1, tl.sum(acc1, axis=0).to(tl.int64, bitcast=True))


def time_gbps(fn, nbytes: int, repeats: int = 30) -> dict[str, float]:
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    gbps = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        gbps.append(nbytes / (start.elapsed_time(end) / 1e3) / 1e9)
    q = statistics.quantiles(gbps, n=4)
    return {"gbps": statistics.median(gbps), "min": min(gbps), "max": max(gbps), "q1": q[0], "q3": q[2], "n": repeats}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", help="also write the results here")
    args = ap.parse_args()
    x = torch.randn(GiB, device="cuda", dtype=torch.bfloat16)  # 2 GiB, a whole number of 128 KiB tiles
    words = x.view(torch.int64)
    nbytes = x.numel() * 2
    programs = words.numel() // (BLOCK * ITERS)
    sums = torch.zeros(2, dtype=torch.int64, device="cuda")
    res: dict[str, dict[str, float]] = {}
    for name, mixers in VARIANTS.items():
        params = (*mixers[0], *mixers[1]) if mixers else (0,) * 10

        def run(params=params, mix=mixers is not None) -> None:
            sums.zero_()
            _kernel[(programs,)](words, sums, *params, MIX=mix, BLOCK=BLOCK, ITERS=ITERS, num_warps=4)

        res[name] = time_gbps(run, nbytes)
    y = x.view(torch.float32)
    res["float32 .sum() (read reference)"] = time_gbps(lambda: y.sum(), nbytes)
    if hasattr(torch, "hash_tensor"):
        res["torch.hash_tensor"] = time_gbps(lambda: torch.hash_tensor(x), nbytes)
    ref = res["float32 .sum() (read reference)"]["gbps"]
    for name, r in res.items():
        print(f"{name:<36} {r['gbps']:8.0f} GB/s  {100 * r['gbps'] / ref:5.1f} % of .sum()  "
              f"(IQR {r['q1']:.0f}-{r['q3']:.0f}, n={r['n']})")  # fmt: skip
    if args.json:
        meta = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__}
        with open(args.json, "w") as f:
            json.dump({"meta": meta, "results": res}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
