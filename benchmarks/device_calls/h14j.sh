#!/usr/bin/env bash
# Issue 14, 2026-12-03 night: the decode GEMM loop variants (scales a trip early, K-block
# pairs) in the default parity-safe rows. GPU tests (variants bitwise the plain loop, every
# default row bitwise the trainer's scaled_mm), 32-layer decode before (.alt = HEAD, made with
# `git archive HEAD services workers protocol kernels benchmarks tests | tar -x -C .alt`) and
# after, fast-mode mismatch. Results: $OUT/h14j.tgz.
set -u
R=/tmp/h14j
mkdir -p "$R"
export OMP_NUM_THREADS=4 TRITON_PRINT_AUTOTUNING=0
stage() { echo "=== $1 ($(date -u +%T))"; }
ROOT=$PWD
source benchmarks/device_env.sh || exit 1
stage tests
timeout 150 python3 -m pytest -q -p no:cacheprovider -m gpu tests/fp8_kernels/test_fused_gpu.py \
  2>&1 | tail -6 | tee "$R/gpu-tests.txt"
decode() {  # $1 = tag, rest = rollout.py arguments
  local tag=$1; shift
  timeout 120 python3 benchmarks/rollout.py --gen 512 --graphs on --batch 64 256 --out "$R" \
    --tag "$tag" "$@" 2>&1 | grep '^row' | sed "s/^/$tag /"
}
stage decode
(cd .alt && source benchmarks/device_env.sh >/dev/null && decode base --modes unified_fp8)
cd "$ROOT" && source benchmarks/device_env.sh >/dev/null
decode new --modes bf16 unified_fp8
stage mismatch
timeout 100 python3 benchmarks/mismatch_attribution.py --presets llama-3.1-8b --layers 2 \
  --variants committed "parity-safe rows off" --out "$R/mm-8b" 2>&1 | grep -v '^{"model' | tail -6
timeout 60 python3 benchmarks/mismatch_attribution.py --variants committed --out "$R/mm-test" \
  2>&1 | grep -v '^{"model' | tail -6
tar czf "${OUT:-/tmp}/h14j.tgz" -C "$R" .
stage done
