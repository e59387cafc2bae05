#!/usr/bin/env bash
# Repeat of the 32-layer decode comparison (parity-safe decode GEMM rows off / on, alternating)
# at batch 16 and 64, to put the run-to-run noise next to the difference.
set -u
source benchmarks/device_env.sh >/dev/null 2>&1 || exit 1
R=${OUT:-benchmarks/results/run}; mkdir -p "$R"
timeout 60 python3 benchmarks/rollout.py --batch 16 64 --gen 512 --graphs on --modes bf16 \
  --out "$R" --tag bf16 2>&1 | grep '^| bf16'
for i in 1 2; do
  for g in off parity-safe; do
    timeout 55 python3 benchmarks/rollout.py --batch 16 64 --gen 512 --graphs on \
      --modes unified_fp8 --decode-gemm $g --out "$R" --tag "fp8-$g-$i" 2>&1 \
      | grep '^| unified' | sed "s/^/$g run $i /"
  done
done
echo "=== done $(date -u +%T)"
