#!/usr/bin/env bash
# One device call: issue-14 GPU tests, fast-mode mismatch attribution, decode (decode GEMM off/on),
# trainer step. Short tables last.
set -u
source benchmarks/device_env.sh || exit 1
R=${OUT:-benchmarks/results/run}; mkdir -p "$R"
export OMP_NUM_THREADS=4 TRITON_PRINT_AUTOTUNING=0
echo "=== tests $(date -u +%T)"
timeout 100 python3 -m pytest -q -p no:cacheprovider -m gpu tests/fp8_kernels/test_fused_gpu.py \
  tests/fp8_kernels/test_decode_table.py 2>&1 | tail -8 | tee "$R/fused-tests.txt"
timeout 90 python3 -m pytest -q -p no:cacheprovider -m gpu tests/gpu --durations=5 2>&1 | tail -14 \
  | tee "$R/parity-tests.txt"
echo "=== attribution $(date -u +%T)"
timeout 100 python3 benchmarks/mismatch_attribution.py --seeds 0 1 --out "$R" 2>&1 \
  | grep -v '^{"model' | tail -40
echo "=== rollout $(date -u +%T)"
timeout 120 python3 benchmarks/rollout.py --batch 64 256 --gen 512 --graphs on \
  --out "$R" --tag rollout-gen512 2>&1 | grep -v '^{' | tail -8
timeout 70 python3 benchmarks/rollout.py --batch 64 256 --gen 512 --graphs on --modes unified_fp8 \
  --decode-gemm --out "$R" --tag rollout-gen512-decode-gemm 2>&1 | grep -v '^{' | tail -5
echo "=== train $(date -u +%T)"
timeout 100 python3 benchmarks/train_step.py --layers 8 --tokens 16384 --profile \
  --out "$R" 2>&1 | grep -v '^{' | tail -30
echo "=== done $(date -u +%T)"
