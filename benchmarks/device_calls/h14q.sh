#!/usr/bin/env bash
# Issue 14, 2026-12-04 (afternoon): where a 32-layer decode step's wall time goes outside the
# captured graph (decode_overhead.py, BF16 and FP8, batch 64 and 256), then fp8_linear with the
# quant in the parity-safe rows' prologue (prologue_tune.py, M <= 64). Results: $OUT/h14q.tgz.
set -u
R=/tmp/h14q
mkdir -p "$R"
export OMP_NUM_THREADS=4 TRITON_PRINT_AUTOTUNING=0
stage() { echo "=== $1 ($(date -u +%T))"; }
source benchmarks/device_env.sh || exit 1
stage overhead
timeout 300 python3 benchmarks/decode_overhead.py --layers 32 --batch 64 256 --gen 512 \
  2>&1 | tee "$R/overhead.txt" | grep -v '^  '
stage prologue
cp kernels/fp8_gemm_decode_table.json "$R/table.json"
timeout 200 python3 benchmarks/prologue_tune.py --table "$R/table.json" --write --out "$R" \
  > "$R/prologue.txt" 2>&1
tail -45 "$R/prologue.txt"
tar czf "${OUT:-/tmp}/h14q.tgz" -C "$R" .
stage done
