#!/usr/bin/env bash
# Issue 14, 2026-12-05, after review fixes to dense_cast.GradSum (sums kept per backward pass,
# inputs checked by autograd history, create_graph on the differentiable ops): the scoring-tail
# GPU tests (GradSum against float64, both modes) and the 16K train step (profiled: the head's
# ∇W must still be the fused FP32 GEMM, no per-chunk copies). Results: $OUT/h14z14.tgz.
set -u
R=/tmp/h14z14
mkdir -p "$R"
export OMP_NUM_THREADS=4 TRITON_PRINT_AUTOTUNING=0
source benchmarks/device_env.sh || exit 1
timeout 120 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_scoring_tail_gpu.py \
  tests/model/test_dense_cast.py > "$R/gpu-tests.txt" 2>&1
grep -E "passed|failed|Error|assert" "$R/gpu-tests.txt" | tail -6
timeout 200 python3 benchmarks/train_step.py --layers 8 --tokens 16384 --exact --profile \
  --out "$R" > "$R/train.log" 2>&1
grep -E '^\||Error' "$R/train.log" | tail -6
grep -E '(all kernels)|direct_copy|CUDAFunctor_add<float>|badd' "$R/train.log" | cut -c1-110
tar czf "${OUT:-/tmp}/h14z14.tgz" -C "$R" .
