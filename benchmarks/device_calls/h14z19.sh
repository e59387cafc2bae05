#!/usr/bin/env bash
# Issue 14, 2026-12-05 (second session), after the review fixes to the cuDNN attention backward
# (padding rows' statistic, errors re-raised, deterministic mode): the attention GPU tests
# (including padding keys with huge scores, BF16 and FP16) and the exact parity loop, which
# trains through the backward. Results: $OUT/h14z19.tgz.
set -u
R=/tmp/h14z19
mkdir -p "$R"
export OMP_NUM_THREADS=4 TRITON_PRINT_AUTOTUNING=0
source benchmarks/device_env.sh || exit 1
timeout 160 python3 -m pytest -q -p no:cacheprovider tests/fp8_kernels/test_exact_triton_gpu.py \
  tests/fp8_kernels/test_attention_cudnn_bwd.py tests/gpu/test_loop_gpu.py > "$R/gpu-tests.txt" 2>&1
grep -E "passed|failed|Error|assert" "$R/gpu-tests.txt" | tail -8
tar czf "${OUT:-/tmp}/h14z19.tgz" -C "$R" .
