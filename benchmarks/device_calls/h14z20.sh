#!/usr/bin/env bash
# Issue 14, for the next session with an H200 (written 2026-12-05, third session, when no device
# was lent): (1) h14z19's GPU tests of the review fixes to the cuDNN attention backward and the
# exact parity loop; (2) the FP8-cache attention sweep (attention_fp8_tune.py: V dequantized after
# Q·Kᵀ, a register cap for three programs per SM, 2-4 stages; each variant checked bitwise against
# the trainer's path). Results: $OUT/h14z20.tgz; the sweep's table is printed last.
set -u
R=/tmp/h14z20
mkdir -p "$R"
export OMP_NUM_THREADS=4 TRITON_PRINT_AUTOTUNING=0
source benchmarks/device_env.sh || exit 1
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv > "$R/gpu.txt" 2>&1
timeout 200 python3 -m pytest -q -p no:cacheprovider tests/fp8_kernels/test_exact_triton_gpu.py \
  tests/fp8_kernels/test_attention_cudnn_bwd.py tests/gpu/test_loop_gpu.py > "$R/gpu-tests.txt" 2>&1
grep -E "passed|failed|Error|assert" "$R/gpu-tests.txt" | tail -8
(cd benchmarks && timeout 300 python3 attention_fp8_tune.py) > "$R/fp8-tune.txt" 2>&1
tar czf "${OUT:-/tmp}/h14z20.tgz" -C "$R" .
sed -n '/^| batch | keys | variant/,$p' "$R/fp8-tune.txt" | tail -60
