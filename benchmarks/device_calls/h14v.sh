#!/usr/bin/env bash
# Issue 14, 2026-12-04 (evening), after h14u.sh: exact mode vs fast mode now that both run the
# invariant attention and keep their decode graphs: 8-layer decode at batch 64 (gen 512, unified
# FP8, fast and exact) and the 8-layer train step at 16K tokens (unified FP8 fast and exact).
# Results: $OUT/h14v.tgz.
set -u
R=/tmp/h14v
mkdir -p "$R"
export OMP_NUM_THREADS=4 TRITON_PRINT_AUTOTUNING=0
stage() { echo "=== $1 ($(date -u +%T))"; }
source benchmarks/device_env.sh || exit 1
stage decode
for exact in "" --exact; do
  timeout 120 python3 benchmarks/rollout.py --graphs on --layers 8 --batch 64 --gen 512 \
    --modes unified_fp8 $exact --out "$R" --tag "decode8${exact}" 2>&1 | grep '^row\|Error' \
    | sed "s/^/fast${exact} /"
done
stage train
timeout 240 python3 benchmarks/train_step.py --tokens 16384 --modes unified_fp8 --exact \
  --out "$R/train" 2>&1 | grep '^|'
tar czf "${OUT:-/tmp}/h14v.tgz" -C "$R" .
stage done
