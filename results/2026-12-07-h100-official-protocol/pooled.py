"""The seven processes a mode of this folder's two runs together: each process's median step against the median
of the `none` processes, and a 95 % bootstrap over processes (10,000 resamples, seeded).

    python results/2026-12-07-h100-official-protocol/pooled.py
"""

import json
import random
import statistics
from pathlib import Path

HERE = Path(__file__).parent
MODES = ("none", "default", "no_drift")


def main() -> None:
    steps: dict[str, list[float]] = {m: [] for m in MODES}
    for run in ("official", "procs6"):
        found = json.loads((HERE / run / "sdk_overhead.json").read_text())["per_process_median_ms"]
        for m in MODES:
            steps[m] += found[m]
    none = statistics.median(steps["none"])
    print(f"none: {len(steps['none'])} processes, median {none:.3f} ms, "
          f"spread {(max(steps['none']) - min(steps['none'])) / none * 100:.2f} %")
    rng = random.Random(0)
    for m in MODES[1:]:
        each = sorted((s / none - 1) * 100 for s in steps[m])
        boot = sorted((statistics.median(rng.choices(steps[m], k=len(steps[m])))
                       / statistics.median(rng.choices(steps["none"], k=len(steps["none"]))) - 1) * 100
                      for _ in range(10_000))
        print(f"{m}: median process {(statistics.median(steps[m]) / none - 1) * 100:+.2f} %, processes "
              f"{', '.join(f'{x:+.2f}' for x in each)} %, 95 % bootstrap {boot[250]:+.2f} to {boot[9749]:+.2f} %")


if __name__ == "__main__":
    main()
