#!/usr/bin/env bash
# Issue 14, 2026-12-04, after h14m.sh rewrote the parity-safe rows (k_trip 4, 128-row tiles):
# the GPU tests (loop variants, every default row bitwise the trainer's scaled_mm, exact
# parity, IPC, the 3-update loop, the kernel tests), fast-mode mismatch (Llama-3.1-8B 2 layers,
# tiny/small llama) and the linear table (kernels.py --only-gemms). Results: $OUT/h14n.tgz.
set -u
R=/tmp/h14n
mkdir -p "$R/kernels"
export OMP_NUM_THREADS=4 TRITON_PRINT_AUTOTUNING=0
stage() { echo "=== $1 ($(date -u +%T))"; }
source benchmarks/device_env.sh || exit 1
stage tests
timeout 300 python3 -m pytest -q -p no:cacheprovider -m gpu tests/fp8_kernels/test_fused_gpu.py \
  tests/gpu tests/fp8_kernels/test_kernels_gpu.py -k "not quantizer_tile_variants" 2>&1 \
  | tail -6 | tee "$R/gpu-tests.txt"
stage mismatch
timeout 90 python3 benchmarks/mismatch_attribution.py --presets llama-3.1-8b --layers 2 \
  --variants committed "parity-safe rows off" --out "$R/mm-8b" 2>&1 | grep -v '^{"model' | tail -6
timeout 50 python3 benchmarks/mismatch_attribution.py --variants committed --out "$R/mm-test" \
  2>&1 | grep -v '^{"model' | tail -6
stage gemms
timeout 150 python3 benchmarks/kernels.py --only-gemms --out "$R/kernels" > "$R/kernels.log" 2>&1
grep -iE "mean|M ≤|M <=" "$R/kernels.log" | tail -8
tar czf "${OUT:-/tmp}/h14n.tgz" -C "$R" .
stage done
