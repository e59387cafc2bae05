#!/usr/bin/env bash
# Issue 14, 2026-12-05 (second session), the committed code (cuDNN refusals fall back to the
# Triton kernels): the attention GPU tests and the 16K train step with exact mode.
# Results: $OUT/h14z19.tgz.
set -u
R=/tmp/h14z19
mkdir -p "$R"
export OMP_NUM_THREADS=4 TRITON_PRINT_AUTOTUNING=0
source benchmarks/device_env.sh || exit 1
timeout 120 python3 -m pytest -q -p no:cacheprovider tests/fp8_kernels/test_exact_triton_gpu.py \
  tests/fp8_kernels/test_attention_cudnn_bwd.py > "$R/gpu-tests.txt" 2>&1
grep -E "passed|failed|Error|assert" "$R/gpu-tests.txt" | tail -6
timeout 200 python3 benchmarks/train_step.py --layers 8 --tokens 16384 --exact \
  --out "$R" > "$R/train.log" 2>&1
grep -E '^\| [bu]|Error' "$R/train.log" | tail -4
tar czf "${OUT:-/tmp}/h14z19.tgz" -C "$R" .
