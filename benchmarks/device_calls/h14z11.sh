#!/usr/bin/env bash
# Issue 14, 2026-12-05: the lm_head's ∇W summed over the scoring chunks in one FP32 buffer
# (dense_cast.GradSum: FP32-output GEMMs accumulating with β = 1, no per-chunk cast and add), the
# attention backward's tuned tiles at head size 64/128/256 (GPU tests), the 128×1 column quant /
# requant tile sweep, the 16K train step (profiled) and 32-layer decode at gen 512 (the engine's
# decode scoring runs the Triton rows since 12-04; not measured since).
# Results: $OUT/h14z11.tgz. Run from the repository root: bash benchmarks/device_calls/h14z11.sh
set -u
R=/tmp/h14z11
mkdir -p "$R"
export OMP_NUM_THREADS=4 TRITON_PRINT_AUTOTUNING=0
stage() { echo "=== $1 ($(date -u +%T))"; }
source benchmarks/device_env.sh || exit 1
stage tests
timeout 200 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_scoring_tail_gpu.py \
  tests/fp8_kernels/test_exact_triton_gpu.py tests/gpu/test_parity_gpu.py > "$R/gpu-tests.txt" 2>&1
grep -E "passed|failed|Error|assert" "$R/gpu-tests.txt" | tail -12
stage train
timeout 200 python3 benchmarks/train_step.py --layers 8 --tokens 16384 --exact --profile \
  --out "$R" > "$R/train.log" 2>&1
grep -E '^\||Error' "$R/train.log" | tail -6
grep -E 'exact=False .*(direct_copy|CUDAFunctor_add<float>|all kernels)' "$R/train.log" | cut -c1-120
stage quantizer-sweep
timeout 150 python3 benchmarks/kernels.py --only-quantizers --out "$R" > "$R/quant.log" 2>&1
grep -E '^\| (128x1|requant|FP8 1x128)' "$R/quant.log" | cut -c1-90
stage decode
timeout 200 python3 benchmarks/rollout.py --graphs on --gen 512 --batch 64 256 \
  --modes unified_fp8 bf16 --out "$R" > "$R/decode.log" 2>&1
grep -E '^\||Error' "$R/decode.log" | tail -8
tar czf "${OUT:-/tmp}/h14z11.tgz" -C "$R" .
stage done
