#!/usr/bin/env bash
# On a GPU node: start embedded detlab and run the train comparisons of the foundation's GPU check.
# Writes each job's JSON (the last line of `detlab submit --wait --json`) to $OUT (default: ./gpu-out).
set -euo pipefail
OUT=${OUT:-gpu-out}
mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE:-0}
data=$(mktemp -d)
detlab up --port 8765 --data-dir "$data" >"$OUT/up.log" 2>&1 &
up=$!
trap 'kill $up 2>/dev/null || true; wait $up 2>/dev/null || true' EXIT
for _ in $(seq 1 120); do
  python3 -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8765/api/v1/health')" 2>/dev/null && break
  sleep 1
done
submit() {  # name, then detlab submit arguments
  local name=$1; shift
  /usr/bin/time -f "$name wall %e s" detlab submit --server http://127.0.0.1:8765 "$@" --wait --json \
    | tail -n 1 >"$OUT/$name.json" || true
}
submit scatter --workload scatter --config default --config torch-deterministic --world-size 1 --steps 10 --repeats 3
submit tiny-lm --workload tiny-lm --config default --config full-deterministic --world-size 1 --steps 50 --repeats 3
python3 - "$OUT" <<'PY'
import json, pathlib, sys
for path in sorted(pathlib.Path(sys.argv[1]).glob("*.json")):
    d = json.loads(path.read_text() or "{}")
    job = d.get("job", {})
    runs = job.get("runs", [])
    print(f"== {path.stem}: job {job.get('status')} on {runs[0].get('device') if runs else None}, "
          f"fingerprint {runs[0].get('fingerprint_impl') if runs else None}")
    print("verdict", d.get("verdict"), "first step", d.get("first_divergent_step"),
          "tensors", d.get("first_divergent_tensors"), "steps differing", d.get("steps_differing"))
    for r in d.get("reproducibility", []):
        print(f"  {r['name']}: {r['identical_to_first']}/{r['repeats'] - 1} repeats identical to the first")
    for t in d.get("throughput", []):
        print(f"  {t['name']}: {t['samples_per_s']:.1f} samples/s IQR {t['spread']} cost {t['cost']}")
    for r in runs:
        if r["status"] != "succeeded":
            print("  run", r["id"], r["status"], (r["error"] or "")[-1500:])
PY
