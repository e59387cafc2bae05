#!/usr/bin/env bash
# Issue 14, 2026-12-03 night: the parity-safe decode GEMM with its per-K-block scale loads
# moved out of the loop trip that uses them (scale_ahead) and K-block pairs. A diagnostic
# sweep of the loop variants on the Llama-3.1-8B shapes, then the full parity-safe sweep that
# rewrites the table's parity_safe rows (every candidate checked bitwise against the trainer's
# scaled_mm rows at M = 4096). Results: $OUT/h14h.tgz (+ the new table).
set -u
R=/tmp/h14h
mkdir -p "$R"
export OMP_NUM_THREADS=4 TRITON_PRINT_AUTOTUNING=0
stage() { echo "=== $1 ($(date -u +%T))"; }
source benchmarks/device_env.sh || exit 1
cd benchmarks
stage diag
timeout 170 python3 gemm_parity_tune.py --shapes llama3.1-8b:o llama3.1-8b:down \
  llama3.1-8b:qkv llama3.1-8b:gate_up --ms 1 64 256 --block-n 32 64 128 --warps 4 \
  --stages 4 6 --variants 0 1 2 0p 1p --out "$R/diag" > "$R/diag.log" 2>&1
tail -3 "$R/diag.log"
python3 variant_summary.py "$R/diag/gemm-parity.json" | tee "$R/diag-variants.md"
stage full
timeout 330 python3 gemm_parity_tune.py --block-n 16 32 64 128 --warps 4 --stages 4 6 \
  --variants 0 2 0p 1p --table ../kernels/fp8_gemm_decode_table.json --out "$R/full" \
  > "$R/full.log" 2>&1
cp ../kernels/fp8_gemm_decode_table.json "$R/"
python3 variant_summary.py "$R/full/gemm-parity.json" > "$R/full-variants.md"
grep -A12 '^| M |' "$R/full/gemm-parity.md"
tar czf "${OUT:-/tmp}/h14h.tgz" -C "$R" .
stage done
