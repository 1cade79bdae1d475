"""The processes of this folder's runs together (the two of the first call, and with `--repeat` also the two
of the second call, `repeat/`): each process's median step against the median
of the `none` processes, and a 95 % bootstrap over processes (10,000 draws, seeded). The bench's
`bootstrap_pct`, each process given as one block of its median: the two runs have 10 and 3 blocks a process, and
all blocks together would weigh the first run more.

    python results/2026-12-07-h100-official-protocol/pooled.py [--repeat]
"""

import json
import statistics
import sys
from pathlib import Path

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE.parents[1] / "bench"))
from sdk_overhead import bootstrap_pct  # noqa: E402

MODES = ("none", "default", "no_drift")


def main() -> None:
    runs = ["official", "procs6"] + (["repeat/official", "repeat/procs6"] if "--repeat" in sys.argv else [])
    steps: dict[str, list[float]] = {m: [] for m in MODES}
    for run in runs:
        found = json.loads((HERE / run / "sdk_overhead.json").read_text())["per_process_median_ms"]
        for m in MODES:
            steps[m] += found[m]
    none = statistics.median(steps["none"])
    print(f"none: {len(steps['none'])} processes, median {none:.3f} ms, "
          f"spread {(max(steps['none']) - min(steps['none'])) / none * 100:.2f} %")
    for m in MODES[1:]:
        each = sorted((s / none - 1) * 100 for s in steps[m])
        lo, hi = bootstrap_pct([[s] for s in steps[m]], [[s] for s in steps["none"]], draws=10_000)
        print(f"{m}: median process {(statistics.median(steps[m]) / none - 1) * 100:+.2f} %, processes "
              f"{', '.join(f'{x:+.2f}' for x in each)} %, 95 % bootstrap {lo:+.2f} to {hi:+.2f} %")


if __name__ == "__main__":
    main()
