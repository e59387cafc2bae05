#!/usr/bin/env bash
# One device call: fused-kernel GPU tests, fast-mode mismatch attribution, GPU parity/loop tests.
set -u
source benchmarks/device_env.sh || exit 1
R=${OUT:-benchmarks/results/run}; mkdir -p "$R"
export OMP_NUM_THREADS=4
echo "=== fused tests $(date -u +%T)"
timeout 130 python3 -m pytest -q -p no:cacheprovider -m gpu tests/fp8_kernels/test_fused_gpu.py 2>&1 | tail -30 | tee "$R/fused-tests.txt"
echo "=== attribution $(date -u +%T)"
timeout 170 python3 benchmarks/mismatch_attribution.py --out "$R" 2>&1 | grep -v '^{"model' | tail -20
echo "=== gpu parity tests $(date -u +%T)"
timeout 240 python3 -m pytest -q -p no:cacheprovider -m gpu tests/gpu --durations=12 2>&1 | tail -40 | tee "$R/parity-tests.txt"
echo "=== done $(date -u +%T)"
