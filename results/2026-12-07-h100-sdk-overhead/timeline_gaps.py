"""Per step of each trace (bench/sdk_overhead.py --timeline; steps after the first three): the recorder's kernels,
copies and memsets by name, the kernel-to-kernel gaps (mean, and the sum of those over 5 us: time the GPU waited
for the host), and the largest sums of gaps by the pair of events around them.

    python results/2026-12-07-h100-sdk-overhead/timeline_gaps.py TRACE.json.gz ...
"""
import collections
import gzip
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import sdk_overhead as b  # noqa: E402

for path in sys.argv[1:]:
    with gzip.open(path, "rt") as f:
        trace = json.load(f)
    ev = sorted((e for e in trace["traceEvents"] if e.get("ph") == "X"
                 and e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")), key=lambda e: e["ts"])
    marks = [e["ts"] for e in ev if b.MARKER in e["name"]]
    spent, pairs = collections.Counter(), collections.Counter()
    counts, mean_gap, long_gaps = [], [], []
    steps = range(b.TIMELINE_SKIP, len(marks) - 1)
    for i in steps:
        step = [e for e in ev if marks[i] <= e["ts"] < marks[i + 1]]
        gaps, end, before = [], None, None
        for e in step:
            name = e["name"][:60]
            spent[name] += e["dur"]
            if end is not None:
                gap = max(0.0, e["ts"] - end)
                gaps.append(gap)
                pairs[(before, name)] += gap
            if end is None or e["ts"] + e["dur"] > end:
                end, before = e["ts"] + e["dur"], name
        counts.append(len(step))
        mean_gap.append(statistics.mean(gaps))
        long_gaps.append(sum(g for g in gaps if g > 5))
    n = len(steps)
    print(f"== {Path(path).name}: {n} steps; events a step {statistics.median(counts)}, mean gap "
          f"{statistics.median(mean_gap):.3f} us, gaps over 5 us {statistics.median(long_gaps):.1f} us a step")
    for name, us in spent.most_common():
        if any(k in name for k in b.DETLAB_KERNELS) or name.startswith(("Memcpy", "Memset")):
            print(f"  {us / n:8.1f} us a step  {name}")
    print(f"  idle {sum(pairs.values()) / n:.1f} us a step; largest by the events around them:")
    for (before, after), us in pairs.most_common(5):
        print(f"  {us / n:8.1f} us  after {before!r} before {after!r}")
