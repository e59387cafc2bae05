#!/usr/bin/env bash
# Issue 14, 2026-12-04 (evening), after h14v.sh: exact mode runs the decode GEMM kernel
# (exact_config) up to M = 256. GPU tests (its rows bitwise the fixed-tile rows at M = 4096;
# exact parity engine vs trainer, across weight updates; kept graphs), then the 8-layer decode at
# batch 64 (fast and exact) and the 8-layer train step at 16K tokens (fast and exact).
# Results: $OUT/h14w.tgz.
set -u
R=/tmp/h14w
mkdir -p "$R"
export OMP_NUM_THREADS=4 TRITON_PRINT_AUTOTUNING=0
stage() { echo "=== $1 ($(date -u +%T))"; }
source benchmarks/device_env.sh || exit 1
stage tests
timeout 240 python3 -m pytest -q -p no:cacheprovider tests/fp8_kernels/test_exact_decode_gemm_gpu.py \
  tests/gpu/test_parity_gpu.py tests/gpu/test_loop_gpu.py tests/gpu/test_graph_decode_gpu.py \
  tests/fp8_kernels/test_exact_triton_gpu.py > "$R/gpu-tests.txt" 2>&1
grep -E "passed|failed|Error|assert" "$R/gpu-tests.txt" | tail -12
stage decode
for exact in "" --exact; do
  timeout 120 python3 benchmarks/rollout.py --graphs on --layers 8 --batch 64 256 --gen 512 \
    --modes unified_fp8 $exact --out "$R" --tag "decode8${exact}" 2>&1 | grep '^row\|Error' \
    | sed "s/^/fast${exact} /"
done
stage train
timeout 200 python3 benchmarks/train_step.py --tokens 16384 --modes unified_fp8 --exact \
  --out "$R/train" 2>&1 | grep '^|'
tar czf "${OUT:-/tmp}/h14w.tgz" -C "$R" .
stage done
