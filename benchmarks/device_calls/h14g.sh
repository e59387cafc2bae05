#!/usr/bin/env bash
# Issue 14, 2026-12-03 evening: the train step re-measured with the weights re-quantized after
# every optimizer step (fused AdamW does not bump version counters; train_step.py now
# invalidates like the trainer), this tree (grouped on/off) against the last commit before
# the grouping (.alt/, its train_step.py patched the same way); the GPU tests of the changed
# code. Results: $OUT/h14g.tgz.
set -u
R=/tmp/h14g
mkdir -p "$R/new-2048" "$R/new-16384" "$R/base-2048" "$R/base-16384"
export OMP_NUM_THREADS=4 TRITON_PRINT_AUTOTUNING=0
stage() { echo "=== $1 ($(date -u +%T))"; }
ROOT=$PWD
source benchmarks/device_env.sh || exit 1
stage train
timeout 45 python3 benchmarks/train_step.py --layers 8 --tokens 2048 --seq 2048 --grouped on off \
  --steps 5 --out "$R/new-2048" 2>&1 | grep '^| [ub]'
timeout 60 python3 benchmarks/train_step.py --layers 8 --tokens 16384 --modes unified_fp8 \
  --grouped on off --out "$R/new-16384" 2>&1 | grep '^| [ub]'
(cd .alt && source benchmarks/device_env.sh >/dev/null \
  && timeout 40 python3 benchmarks/train_step.py --layers 8 --tokens 2048 --seq 2048 --steps 5 \
     --out "$R/base-2048" 2>&1 | grep '^| [ub]' \
  && timeout 60 python3 benchmarks/train_step.py --layers 8 --tokens 16384 \
     --out "$R/base-16384" 2>&1 | grep '^| [ub]')
cd "$ROOT" && source benchmarks/device_env.sh >/dev/null
stage tests
timeout 170 python3 -m pytest -q -p no:cacheprovider -m gpu tests/gpu \
  tests/fp8_kernels/test_linear_group_gpu.py tests/fp8_kernels/test_transpose_gpu.py \
  tests/fp8_kernels/test_kernels_gpu.py -k "not quantizer_tile_variants" 2>&1 | tail -3 | tee "$R/gpu-tests.txt"
tar czf "${OUT:-/tmp}/h14g.tgz" -C "$R" .
stage done
