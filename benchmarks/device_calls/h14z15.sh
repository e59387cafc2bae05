#!/usr/bin/env bash
# Issue 14, 2026-12-05 (second session): the invariant attention forward's tiles as one
# arithmetic for trainer and engine (BLOCK_N 64/128, 4/8 warps; decode over BF16 and FP8
# caches, trainer 4 × 4,096; bitwise checks per arithmetic), and FA2's backward fed our
# forward's (out, lse) against the Triton backward. Results: $OUT/h14z15.tgz. As run, the
# backward experiment was an FA2 script that failed on its arguments; attention_backward_ab.py is
# its successor (cuDNN and FA2 via SDPA, h14z17.sh).
set -u
R=/tmp/h14z15
mkdir -p "$R"
export OMP_NUM_THREADS=4 TRITON_PRINT_AUTOTUNING=0
source benchmarks/device_env.sh || exit 1
cd benchmarks
timeout 150 python3 attention_backward_ab.py > "$R/flash-bwd.txt" 2>&1
tail -6 "$R/flash-bwd.txt"
timeout 400 python3 attention_tile_sweep.py > "$R/tile-sweep.txt" 2>&1
tail -14 "$R/tile-sweep.txt"
tar czf "${OUT:-/tmp}/h14z15.tgz" -C "$R" .
