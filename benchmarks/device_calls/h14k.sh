#!/usr/bin/env bash
# Issue 14, 2026-12-03 night: decode throughput before (.alt = HEAD before the loop variants,
# `git archive HEAD services workers protocol kernels benchmarks tests | tar -x -C .alt`) and
# after, alternating twice (32 layers, gen 512, CUDA graphs), then the GEMM / fp8_linear table
# (kernels.py --only-gemms). Results: $OUT/h14k.tgz.
set -u
R=/tmp/h14k
mkdir -p "$R/kernels"
export OMP_NUM_THREADS=4 TRITON_PRINT_AUTOTUNING=0
stage() { echo "=== $1 ($(date -u +%T))"; }
ROOT=$PWD
source benchmarks/device_env.sh || exit 1
decode() {  # $1 = tag, rest = rollout.py arguments
  local tag=$1; shift
  timeout 100 python3 benchmarks/rollout.py --gen 512 --graphs on --batch 64 256 --out "$R" \
    --tag "$tag" "$@" 2>&1 | grep '^row' | sed "s/^/$tag /"
}
stage decode
for i in 1 2; do
  decode "new-$i" --modes unified_fp8
  (cd .alt && source benchmarks/device_env.sh >/dev/null && decode "base-$i" --modes unified_fp8)
  cd "$ROOT" && source benchmarks/device_env.sh >/dev/null
done
decode bf16 --modes bf16
stage gemms
timeout 200 python3 benchmarks/kernels.py --only-gemms --out "$R/kernels" > "$R/kernels.log" 2>&1
grep -iE "mean|M ≤|M <=" "$R/kernels.log" | tail -8
tar czf "${OUT:-/tmp}/h14k.tgz" -C "$R" .
stage done
