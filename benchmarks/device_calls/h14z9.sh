#!/usr/bin/env bash
# Issue 14, written 2026-12-04 night with no device lent, NOT RUN yet: the second call of the next
# session (after h14z8.sh). The trainer's attention backward has its own tiles per kernel since
# this commit (attention_exact_triton.DQ_TILES / DKDV_TILES, free to tune: the backward need not
# be invariant); the sweep times 8 candidates at the 16K train step's shape (4 × 4096 causal,
# Llama-3.1-8B heads) with their gradients' distance to the default's. Then fp8_linear at decode
# and train sizes (h14z7's gemms stage; not measured since 12-02).
# Results: $OUT/h14z9.tgz. Run from the repository root: bash benchmarks/device_calls/h14z9.sh
set -u
R=/tmp/h14z9
mkdir -p "$R"
export OMP_NUM_THREADS=4 TRITON_PRINT_AUTOTUNING=0
stage() { echo "=== $1 ($(date -u +%T))"; }
source benchmarks/device_env.sh || exit 1
stage attention-bwd-sweep
timeout 240 python3 benchmarks/attention_exact_sweep.py 2>&1 | tee "$R/attention-sweep.txt" | tail -16
stage gemms
timeout 300 python3 benchmarks/kernels.py --only-gemms --out "$R" 2>&1 | grep -v '^  ' | tail -40
tar czf "${OUT:-/tmp}/h14z9.tgz" -C "$R" .
stage done
