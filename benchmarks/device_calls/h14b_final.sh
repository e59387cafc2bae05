#!/usr/bin/env bash
# Short validation call (issue 14 deliverable 6): exact kernel tests, 16K train step exact vs
# fast, parity/loop GPU tests. (The full call is h14b_call.sh.)
set -u
source benchmarks/device_env.sh || exit 1
R=${OUT:-benchmarks/results/run}
export OMP_NUM_THREADS=4
timeout 30 python3 -m pytest -q -x -p no:cacheprovider -m gpu tests/fp8_kernels/test_exact_triton_gpu.py \
  "tests/fp8_kernels/test_fused_gpu.py::test_exact_mode_rows_are_bitwise_equal_at_m1_and_m4096" \
  2>&1 | tail -4 | tee "$R/exact-tests.txt"
timeout 45 python3 benchmarks/train_step.py --layers 8 --tokens 16384 --modes unified_fp8 \
  --exact --out "$R" 2>&1 | grep -v '^{' | tail -4
timeout 50 python3 -m pytest -q -p no:cacheprovider -m gpu tests/gpu 2>&1 | tail -4 | tee "$R/parity-tests.txt"
echo "=== done $(date -u +%T)"
