#!/usr/bin/env bash
# Issue 14, 2026-12-04 (night), call 2: which decode rows of a 16-row attention tile differ, and
# where a batch-256 decode step's kernel time goes (BF16 vs unified FP8, 8 layers).
set -u
R=/tmp/h14z2
mkdir -p "$R"
export OMP_NUM_THREADS=4 TRITON_PRINT_AUTOTUNING=0
source benchmarks/device_env.sh || exit 1
cd benchmarks
timeout 120 python3 attention_decode_tile.py --parity-only > "$R/tile-parity.txt" 2>&1
cat "$R/tile-parity.txt" | cut -c1-600
timeout 200 python3 decode_profile.py --layers 8 --batch 256 --context 384 --top 16 --out "$R/prof256" > "$R/prof256.txt" 2>&1
cat "$R/prof256.txt" | cut -c1-150 | tail -45
tar czf "${OUT:-/tmp}/h14z2.tgz" -C "$R" .
