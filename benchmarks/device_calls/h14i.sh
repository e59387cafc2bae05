#!/usr/bin/env bash
# Issue 14, 2026-12-03 night: the parity-safe decode GEMM sweep over the loop variants
# (scale_ahead 0/1 x k_trip 1/2/4; every candidate checked bitwise against the trainer's
# scaled_mm rows at M = 4096), which rewrites the table's parity_safe rows, then the GPU tests
# of the decode kernel and its default rows. Results: $OUT/h14i.tgz (+ the new table).
# It ran the reverted call-2 kernel (k_trip 4, vector scale loads); the committed kernel refuses
# k_trip 4, so those candidates are skipped now. The committed table is call 1's (h14h.sh).
set -u
R=/tmp/h14i
mkdir -p "$R"
export OMP_NUM_THREADS=4 TRITON_PRINT_AUTOTUNING=0
stage() { echo "=== $1 ($(date -u +%T))"; }
source benchmarks/device_env.sh || exit 1
stage sweep
(cd benchmarks && timeout 360 python3 gemm_parity_tune.py --block-n 16 32 64 128 --warps 4 \
  --stages 2 3 4 --variants 0x1 1x1 1x2 1x4 --table ../kernels/fp8_gemm_decode_table.json \
  --out "$R/full" > "$R/full.log" 2>&1; tail -2 "$R/full.log")
cp kernels/fp8_gemm_decode_table.json "$R/"
python3 benchmarks/variant_summary.py "$R/full/gemm-parity.json" | tee "$R/full-variants.md" | cut -c1-120
grep -A9 '^| M |' "$R/full/gemm-parity.md"
stage tests
timeout 150 python3 -m pytest -q -p no:cacheprovider -m gpu tests/fp8_kernels/test_fused_gpu.py \
  tests/fp8_kernels/test_decode_table.py 2>&1 | tail -4 | tee "$R/gpu-tests.txt"
tar czf "${OUT:-/tmp}/h14i.tgz" -C "$R" .
stage done
