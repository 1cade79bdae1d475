#!/usr/bin/env bash
# Issue 23 on one H200, as one command (about 7 minutes): the GPU tests of the one-pass kernel and of the
# recorder on CUDA, then bench/sdk_overhead.py as the issue asks (GPT-2 small; none / default / no_drift, and
# drift_every_step, the recorder that sketches every step; 3 interleaved processes each, 10 blocks). Everything
# lands under $OUT:
#   $OUT/gpu_tests.txt                                   pytest's output (exit status in gpu_tests.rc)
#   $OUT/<date>-h200-sdk-overhead/sdk_overhead.json      the bench's JSON (rewritten after every round)
#   $OUT/sdk_overhead.txt, $OUT/env.txt                  the bench's log, the machine
#   $OUT/onepass.txt                                     bench/onepass.py: the one-pass kernel against .sum()
# Run from the repository root with detlab importable (installed, or PYTHONPATH=.): bash bench/h200_alwayson.sh
set -u
OUT=${OUT:-out}
mkdir -p "$OUT"
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"; } > "$OUT/env.txt" 2>&1
cat "$OUT/env.txt"
timeout 60 python3 bench/onepass.py 2>&1 | tee "$OUT/onepass.txt"
# Bounded, so that the bench runs whatever the kernel bench and the tests do.
timeout 150 python3 -m pytest -q -p no:cacheprovider tests/tensors/test_onepass.py \
  tests/tensors/test_drift.py tests/sdk/test_gpu.py 2>&1 | tee "$OUT/gpu_tests.txt"
echo "${PIPESTATUS[0]}" > "$OUT/gpu_tests.rc"
timeout 400 python3 bench/sdk_overhead.py --procs 3 --blocks 10 --every-step \
  --out "$OUT/$(date -u +%F)-h200-sdk-overhead" 2>&1 | tee "$OUT/sdk_overhead.txt"
echo "tests exit $(cat "$OUT/gpu_tests.rc"); bench exit ${PIPESTATUS[0]}"
