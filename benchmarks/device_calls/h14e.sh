#!/usr/bin/env bash
# Issue 14, 2026-12-03 evening: q/k/v and gate/up as one FP8 GEMM per pass in the trainer
# (kernels.linear_group). Every GPU test (megatron-core's cp312 wheel carried in
# .whl-megatron/), the train step with the grouping on and off at 2K and 16K tokens (one
# process each, so the A/B shares the machine state), the fast-mode mismatch and the host
# time per FP8 linear. Results come back as one archive ($OUT/h14e.tgz).
set -u
R=/tmp/h14e
mkdir -p "$R/ts-2048" "$R/ts-16384"
export OMP_NUM_THREADS=4 TRITON_PRINT_AUTOTUNING=0
source benchmarks/device_env.sh || exit 1
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/fp8rl-site \
  .whl-megatron/*.whl 2>&1 | grep -v WARNING
stage() { echo "=== $1 ($(date -u +%T))"; }
stage train
timeout 90 python3 benchmarks/train_step.py --layers 8 --tokens 2048 --seq 2048 --grouped on off \
  --steps 5 --out "$R/ts-2048" 2>&1 | grep '^|'
timeout 120 python3 benchmarks/train_step.py --layers 8 --tokens 16384 --grouped on off \
  --out "$R/ts-16384" 2>&1 | grep '^|'
stage mismatch
timeout 150 python3 benchmarks/mismatch_attribution.py --variants committed --seeds 0 1 --out "$R" \
  2>&1 | grep -v '^{' | tail -8
stage tests
timeout 330 python3 -m pytest -q -p no:cacheprovider -m gpu tests/fp8_kernels tests/gpu \
  tests/megatron/test_megatron_gpu.py tests/megatron/test_trainer.py 2>&1 | tail -15 \
  | tee "$R/all-gpu-tests.txt"
tar czf "${OUT:-/tmp}/h14e.tgz" -C "$R" .
stage done
