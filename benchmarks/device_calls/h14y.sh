#!/usr/bin/env bash
# Issue 14, 2026-12-04 (evening), after a review of a1bb9ab: exact_config now gets (m, n, k) in
# order (the tuned non-square rows were skipped), n_visible is clamped to the keys given, kept
# graphs key on the kernel switches. GPU tests, then the 8-layer decode at batch 64, fast and
# exact. Results: $OUT/h14y.tgz.
set -u
R=/tmp/h14y
mkdir -p "$R"
export OMP_NUM_THREADS=4 TRITON_PRINT_AUTOTUNING=0
source benchmarks/device_env.sh || exit 1
timeout 110 python3 -m pytest -q -p no:cacheprovider tests/fp8_kernels/test_exact_decode_gemm_gpu.py \
  tests/gpu/test_parity_gpu.py tests/gpu/test_graph_decode_gpu.py \
  tests/fp8_kernels/test_exact_triton_gpu.py > "$R/gpu-tests.txt" 2>&1
grep -E "passed|failed|Error|assert" "$R/gpu-tests.txt" | tail -8
for exact in "" --exact; do
  timeout 40 python3 benchmarks/rollout.py --graphs on --layers 8 --batch 64 --gen 512 \
    --modes unified_fp8 $exact --out "$R" --tag "decode8${exact}" 2>&1 | grep '^row\|Error' \
    | sed "s/^/fast${exact} /"
done
tar czf "${OUT:-/tmp}/h14y.tgz" -C "$R" .
