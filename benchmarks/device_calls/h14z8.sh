#!/usr/bin/env bash
# Issue 14, written 2026-12-04 with no device lent, NOT RUN yet: the first call of the next
# session (supersedes the tests and train parts of h14z7.sh; run h14z7.sh's "gemms" stage second).
# The scoring tail changed without a GPU: the FP32 lm_head cast once per pass (Decoder.head,
# kernels/dense_cast.py) and the token log-softmax + entropy as Triton rows in both modes
# (kernels/logprob_triton.py, invariant.set_fast_logprobs). This call runs the GPU tests that
# cover them (new: fast rows = exact rows, BF16 ∇logits, entropy, the cast head bitwise), the
# parity and graph-decode tests (fast-mode mismatch must stay 1.00000000), and the 16K train step
# with the old tail against the new one (bf16, unified FP8, exact), profiled.
# Results: $OUT/h14z8.tgz. Run from the repository root: bash benchmarks/device_calls/h14z8.sh
set -u
R=/tmp/h14z8
mkdir -p "$R"
export OMP_NUM_THREADS=4 TRITON_PRINT_AUTOTUNING=0
stage() { echo "=== $1 ($(date -u +%T))"; }
source benchmarks/device_env.sh || exit 1
stage tests
timeout 240 python3 -m pytest -q -p no:cacheprovider tests/fp8_kernels/test_exact_triton_gpu.py \
  tests/gpu/test_scoring_tail_gpu.py tests/gpu/test_parity_gpu.py tests/gpu/test_graph_decode_gpu.py \
  > "$R/gpu-tests.txt" 2>&1
grep -E "passed|failed|Error|assert|mult_prob" "$R/gpu-tests.txt" | tail -14
stage train
timeout 300 python3 benchmarks/train_step.py --layers 8 --tokens 16384 --tail fused torch \
  --exact --profile --out "$R" 2>&1 | grep -v '^{' | grep -v '^- host' | tail -60
tar czf "${OUT:-/tmp}/h14z8.tgz" -C "$R" .
stage done
