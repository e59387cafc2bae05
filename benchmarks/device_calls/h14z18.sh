#!/usr/bin/env bash
# Issue 14, 2026-12-05 (second session), after the trainer's attention backward moved to cuDNN
# (kernels/attention_cudnn_bwd.py): the GPU tests that train through it (the exact parity loop
# across 3 weight updates, fast-mode parity, the scoring tail, the kernels) and the 16K train
# step profiled (top kernels: cuDNN's backward in place of the Triton dQ / dK-dV kernels).
# Results: $OUT/h14z18.tgz.
set -u
R=/tmp/h14z18
mkdir -p "$R"
export OMP_NUM_THREADS=4 TRITON_PRINT_AUTOTUNING=0
source benchmarks/device_env.sh || exit 1
timeout 250 python3 -m pytest -q -p no:cacheprovider tests/fp8_kernels/test_exact_triton_gpu.py \
  tests/gpu/test_scoring_tail_gpu.py tests/gpu/test_loop_gpu.py tests/gpu/test_parity_gpu.py \
  tests/fp8_kernels/test_kernels_gpu.py > "$R/gpu-tests.txt" 2>&1
grep -E "passed|failed|Error|assert" "$R/gpu-tests.txt" | tail -8
timeout 200 python3 benchmarks/train_step.py --layers 8 --tokens 16384 --profile \
  --out "$R" > "$R/train.log" 2>&1
grep -E '^\| [bu]|Error' "$R/train.log" | tail -4
grep -E '^- (bf16|unified)' "$R/train.log" | grep -i -E "attn|attention|cudnn|fmha|sdpa|_bwd_|_fwd_kernel" | cut -c1-150 | head -12
tar czf "${OUT:-/tmp}/h14z18.tgz" -C "$R" .
