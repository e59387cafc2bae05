#!/usr/bin/env bash
# Issue 14, 2026-12-05, last call: the committed code's 16K train step (bf16, unified FP8 fast
# and exact; profiled): tuned attention-backward tiles (the row-major dK/dV kernel kept: the
# key-major form of h14z12 was slower), the lm_head ∇W summed over chunks in both modes, exact
# mode's DGrad/WGrad on the fast kernels. Results: $OUT/h14z13.tgz.
set -u
R=/tmp/h14z13
mkdir -p "$R"
export OMP_NUM_THREADS=4 TRITON_PRINT_AUTOTUNING=0
source benchmarks/device_env.sh || exit 1
timeout 200 python3 benchmarks/train_step.py --layers 8 --tokens 16384 --exact --profile \
  --out "$R" > "$R/train.log" 2>&1
grep -E '^\||Error' "$R/train.log" | tail -6
grep -E '(all kernels)|_bwd_dkdv|_blockwise_fp8' "$R/train.log" | cut -c1-110
tar czf "${OUT:-/tmp}/h14z13.tgz" -C "$R" .
