#!/usr/bin/env bash
# One device call for issue 14 deliverable 6 (exact mode at real lengths): the exact-mode GPU
# tests, the parity/loop GPU tests, the 16K train step and batch-64 decode, exact vs fast.
set -u
source benchmarks/device_env.sh || exit 1
R=${OUT:-benchmarks/results/run}
export OMP_NUM_THREADS=4
echo "=== exact kernel tests"
timeout 150 python3 -m pytest -q -x -p no:cacheprovider -m gpu tests/fp8_kernels/test_exact_triton_gpu.py \
  "tests/fp8_kernels/test_fused_gpu.py::test_exact_mode_rows_are_bitwise_equal_at_m1_and_m4096" \
  2>&1 | tail -15 | tee "$R/exact-tests.txt"
echo "=== train step"
timeout 100 python3 benchmarks/train_step.py --layers 8 --tokens 16384 --modes unified_fp8 \
  --exact --out "$R" 2>&1 | grep -v '^{' | tail -8
echo "=== decode"
for ex in "" --exact; do
  timeout 80 python3 benchmarks/rollout.py --layers 8 --batch 64 --gen 512 --graphs on \
    --modes unified_fp8 $ex --out "$R" --tag "rollout${ex:+-exact}" 2>&1 | grep -v '^{' | tail -2
done
echo "=== parity + loop tests"
timeout 200 python3 -m pytest -q -p no:cacheprovider -m gpu tests/gpu 2>&1 | tail -15 | tee "$R/parity-tests.txt"
echo "=== exact train-step profile"
timeout 40 python3 benchmarks/exact_profile.py --parts train --exact-only --top 14 2>&1 | grep -v Warn \
  | tail -16 | tee "$R/profile-exact-train.txt"
if [ -n "${SWEEP:-}" ]; then
  echo "=== attention tile sweep"
  timeout 75 python3 benchmarks/attention_exact_sweep.py 2>&1 | grep -v Warn | tail -20
fi
echo "=== done $(date -u +%T)"
