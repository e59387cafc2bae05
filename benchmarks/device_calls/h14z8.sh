#!/usr/bin/env bash
# Issue 14, written 2026-12-04 with no device lent, NOT RUN yet: the first call of the next
# session (supersedes the tests and train parts of h14z7.sh; run h14z7.sh's "gemms" stage second).
# The train step changed without a GPU: the FP32 lm_head cast once per pass (Decoder.head,
# kernels/dense_cast.py), the token log-softmax + entropy as Triton rows in both modes
# (kernels/logprob_triton.py, invariant.set_fast_logprobs), and the fast RMSNorm / SwiGLU backward
# in one Triton pass each (kernels/fused_backward_triton.py, fused.set_triton_backward). This call
# runs the GPU tests that cover them (fast rows = exact rows, BF16 ∇logits, entropy, the cast head
# bitwise, the training tail = the engine's scores, the backward kernels' accuracy), the parity and
# graph-decode tests (fast-mode mismatch must stay 1.00000000), and the 16K train step before and
# after (--variant new old; bf16, unified FP8, exact), profiled (top 30 kernels).
# Results: $OUT/h14z8.tgz. Run from the repository root: bash benchmarks/device_calls/h14z8.sh
set -u
R=/tmp/h14z8
mkdir -p "$R"
export OMP_NUM_THREADS=4 TRITON_PRINT_AUTOTUNING=0
stage() { echo "=== $1 ($(date -u +%T))"; }
source benchmarks/device_env.sh || exit 1
stage tests
timeout 240 python3 -m pytest -q -p no:cacheprovider tests/fp8_kernels/test_exact_triton_gpu.py \
  tests/fp8_kernels/test_fused_backward_gpu.py \
  tests/gpu/test_scoring_tail_gpu.py tests/gpu/test_parity_gpu.py tests/gpu/test_graph_decode_gpu.py \
  > "$R/gpu-tests.txt" 2>&1
grep -E "passed|failed|Error|assert|mult_prob" "$R/gpu-tests.txt" | tail -14
stage train
timeout 300 python3 benchmarks/train_step.py --layers 8 --tokens 16384 --variant new old \
  --exact --profile --out "$R" > "$R/train.log" 2>&1
grep -E '^\||Error' "$R/train.log" | tail -12  # the table; the kernel lists are in train-step.md
grep -E '^- (unified_fp8|bf16) exact=False .*variant=(new|old): .*(all kernels)' "$R/train.log"
tar czf "${OUT:-/tmp}/h14z8.tgz" -C "$R" .
stage done
