#!/usr/bin/env bash
# Issue 14, 2026-12-04: the parity-safe decode GEMM with four K blocks per trip (k_trip 4,
# scalar scale loads) and 128-row tiles. First the loop-variant GPU test (every variant bitwise
# the plain loop), then two sweeps that rewrite the table's parity_safe rows of the points they
# cover (every candidate checked bitwise against the trainer's scaled_mm rows at M = 4096):
# A: M = 128 and 256, all shapes, BLOCK_M 64/128; B: M = 1-64, the latency-bound qkv/o/down
# shapes, k_trip 2/4. Then test_fused_gpu.py on the new table. Results: $OUT/h14m.tgz.
set -u
R=/tmp/h14m
mkdir -p "$R"
export OMP_NUM_THREADS=4 TRITON_PRINT_AUTOTUNING=0
stage() { echo "=== $1 ($(date -u +%T))"; }
source benchmarks/device_env.sh || exit 1
stage variant-test
timeout 120 python3 -m pytest -q -p no:cacheprovider -m gpu tests/fp8_kernels/test_fused_gpu.py \
  -k loop_variants 2>&1 | tail -15 | tee "$R/variant-test.txt"
cd benchmarks
stage sweep-a
timeout 260 python3 gemm_parity_tune.py --ms 128 256 --block-m 64 128 --block-n 32 64 128 \
  --warps 4 8 --stages 3 4 --variants 0x1 1x2 1x4 --table ../kernels/fp8_gemm_decode_table.json \
  --out "$R/sweep-a" > "$R/sweep-a.log" 2>&1
tail -2 "$R/sweep-a.log"; grep -A4 '^| M |' "$R/sweep-a/gemm-parity.md"
python3 variant_summary.py "$R/sweep-a/gemm-parity.json" > "$R/sweep-a-variants.md"
stage sweep-b
timeout 160 python3 gemm_parity_tune.py --ms 1 8 16 32 64 --block-n 16 32 64 --warps 4 \
  --stages 2 4 6 --variants 1x2 0x4 1x4 --shapes llama3.1-8b:qkv llama3.1-8b:o llama3.1-8b:down \
  qwen2.5-7b:qkv qwen2.5-7b:o qwen2.5-7b:down --table ../kernels/fp8_gemm_decode_table.json \
  --out "$R/sweep-b" > "$R/sweep-b.log" 2>&1
tail -2 "$R/sweep-b.log"; grep -A7 '^| M |' "$R/sweep-b/gemm-parity.md"
python3 variant_summary.py "$R/sweep-b/gemm-parity.json" > "$R/sweep-b-variants.md"
cp ../kernels/fp8_gemm_decode_table.json "$R/"
cd ..
stage table-tests
timeout 150 python3 -m pytest -q -p no:cacheprovider -m gpu tests/fp8_kernels/test_fused_gpu.py \
  2>&1 | tail -6 | tee "$R/fused-tests.txt"
tar czf "${OUT:-/tmp}/h14m.tgz" -C "$R" .
stage done
