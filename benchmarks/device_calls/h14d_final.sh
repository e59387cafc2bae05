#!/usr/bin/env bash
# Issue 14, 2026-12-03 afternoon, final check of the fused RoPE + KV write and the per-forward
# attention mask: every GPU test (megatron-core's cp312 wheel carried in .whl-megatron/) and
# exact vs fast mode (8 layers: 16K-token train step, batch-64 decode). Results come back as
# one archive ($OUT/h14d-final.tgz).
set -u
R=/tmp/h14d-final
mkdir -p "$R/ts-exact"
export OMP_NUM_THREADS=4 TRITON_PRINT_AUTOTUNING=0
source benchmarks/device_env.sh || exit 1
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/fp8rl-site \
  .whl-megatron/*.whl 2>&1 | grep -v WARNING
stage() { echo "=== $1 ($(date -u +%T))"; }
stage tests
timeout 330 python3 -m pytest -q -p no:cacheprovider -m gpu tests/fp8_kernels tests/gpu \
  tests/megatron/test_megatron_gpu.py tests/megatron/test_trainer.py 2>&1 | tail -15 \
  | tee "$R/all-gpu-tests.txt"
stage exact
timeout 100 python3 benchmarks/train_step.py --layers 8 --tokens 16384 --modes unified_fp8 \
  --exact --out "$R/ts-exact" 2>&1 | grep -v '^{' | tail -6
for ex in "" --exact; do
  timeout 90 python3 benchmarks/rollout.py --layers 8 --batch 64 --gen 512 --graphs on \
    --modes unified_fp8 $ex --out "$R" --tag "rollout-8l${ex:+-exact}" 2>&1 | grep '^row'
done
tar czf "${OUT:-/tmp}/h14d-final.tgz" -C "$R" .
stage done
