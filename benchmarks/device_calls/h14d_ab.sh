#!/usr/bin/env bash
# Issue 14, 2026-12-03 afternoon: GPU tests of the fused RoPE + KV-cache write, then an
# interleaved A/B of decode throughput: the commit before it (.alt/base, made with
# `git archive HEAD services workers protocol kernels benchmarks tests | tar -x -C .alt/base`,
# carried) against this tree, twice each, in one device call.
set -u
R=${OUT:-benchmarks/results/run}
mkdir -p "$R"
export OMP_NUM_THREADS=4
source benchmarks/device_env.sh || exit 1
timeout 240 python3 -m pytest -q -p no:cacheprovider -m gpu tests/fp8_kernels/test_rope_kv_gpu.py \
  tests/fp8_kernels/test_fused_gpu.py tests/gpu 2>&1 | tail -8 | tee "$R/gpu-tests.txt"
decode() {  # $1 = tag, rest = rollout.py arguments
  local tag=$1; shift
  timeout 110 python3 benchmarks/rollout.py --gen 512 --graphs on --out "$R" --tag "$tag" "$@" \
    2>&1 | grep '^row' | sed "s/^/$tag /"
}
for i in 1 2; do
  (cd .alt/base && source benchmarks/device_env.sh >/dev/null && decode "base-$i" --batch 64 256)
  source benchmarks/device_env.sh >/dev/null
  decode "new-$i" --batch 64 256
done
(cd .alt/base && source benchmarks/device_env.sh >/dev/null && \
  decode base-fp8kv --layers 8 --batch 64 --modes unified_fp8 --kv fp8)
source benchmarks/device_env.sh >/dev/null
decode new-fp8kv --layers 8 --batch 64 --modes unified_fp8 --kv fp8
