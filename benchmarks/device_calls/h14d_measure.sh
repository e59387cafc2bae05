#!/usr/bin/env bash
# Issue 14, 2026-12-03 afternoon, after the fused RoPE + KV write and the per-forward attention
# mask: where a decode step's time goes, the fast-mode mismatch, the trainer step, host time per
# FP8 linear call and the GEMM table, in one device call. All result files come back as one
# archive ($OUT/h14d.tgz: a device call returns at most 8 files).
set -u
R=/tmp/h14d
mkdir -p "$R/ts-16384" "$R/ts-2048"
export OMP_NUM_THREADS=4
source benchmarks/device_env.sh || exit 1
stage() { echo "=== $1 ($(date -u +%T))"; }
stage profile
timeout 100 python3 benchmarks/decode_profile.py --layers 8 --batch 64 --out "$R" 2>&1 | tail -40
stage mismatch
timeout 150 python3 benchmarks/mismatch_attribution.py --variants committed --seeds 0 1 --out "$R" \
  2>&1 | grep -v '^{' | tail -10
stage train
timeout 100 python3 benchmarks/train_step.py --layers 8 --tokens 16384 --out "$R/ts-16384" 2>&1 | grep -v '^{' | tail -6
timeout 60 python3 benchmarks/train_step.py --layers 8 --tokens 2048 --seq 2048 --out "$R/ts-2048" 2>&1 | grep -v '^{' | tail -6
stage cpu
timeout 60 python3 benchmarks/cpu_overhead.py --out "$R" 2>&1 | tail -14
stage gemms
timeout 200 python3 benchmarks/kernels.py --only-gemms --out "$R" 2>&1 | grep -v '^  ' | tail -5
tar czf "${OUT:-/tmp}/h14d.tgz" -C "$R" .
stage done
