#!/usr/bin/env bash
# One device call for the parity-safe decode GEMM (issue 14): GPU tests (incl. every default
# dispatch row bitwise the trainer's scaled_mm), fast-mode mismatch on 8B shapes and the test
# models, 32-layer decode throughput with the parity-safe rows on and off. Short tables last.
set -u
source benchmarks/device_env.sh || exit 1
R=${OUT:-benchmarks/results/run}; mkdir -p "$R"
export OMP_NUM_THREADS=4
echo "=== gpu tests $(date -u +%T)"
timeout 180 python3 -m pytest -q -p no:cacheprovider -m gpu tests/gpu \
  tests/fp8_kernels/test_fused_gpu.py --durations=5 2>&1 | tail -16 | tee "$R/gpu-tests.txt"
echo "=== rollout, 32 layers $(date -u +%T)"
timeout 130 python3 benchmarks/rollout.py --batch 64 256 --gen 512 --graphs on \
  --modes bf16 unified_fp8 --out "$R" --tag rollout-gen512-parity-safe 2>&1 | grep -v '^{' | tail -8
timeout 75 python3 benchmarks/rollout.py --batch 64 256 --gen 512 --graphs on \
  --modes unified_fp8 --decode-gemm off --out "$R" --tag rollout-gen512-off 2>&1 \
  | grep -v '^{' | tail -5
echo "=== mismatch $(date -u +%T)"
timeout 100 python3 benchmarks/mismatch_attribution.py --presets llama-3.1-8b --layers 2 \
  --variants committed "parity-safe rows off" --out "$R/mm-8b" 2>&1 \
  | grep -v '^{"model' | tail -8
timeout 50 python3 benchmarks/mismatch_attribution.py --variants committed --out "$R/mm-test" \
  2>&1 | grep -v '^{"model' | tail -6
echo "=== done $(date -u +%T)"
