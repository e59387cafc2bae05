#!/usr/bin/env bash
# Issue 14, 2026-12-03 night: GPU tests of the final decode GEMM table and loop (every default
# row bitwise the trainer's scaled_mm, the loop variants, exact parity, IPC, the 3-update loop,
# the kernel tests). Results: $OUT/h14l.txt.
set -u
export OMP_NUM_THREADS=4 TRITON_PRINT_AUTOTUNING=0
source benchmarks/device_env.sh || exit 1
timeout 330 python3 -m pytest -q -p no:cacheprovider -m gpu tests/fp8_kernels/test_fused_gpu.py \
  tests/gpu tests/fp8_kernels/test_kernels_gpu.py -k "not quantizer_tile_variants" 2>&1 \
  | tail -4 | tee "${OUT:-/tmp}/h14l.txt"
