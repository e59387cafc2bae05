#!/usr/bin/env bash
# Issue 14, 2026-12-04, last call: the loop-variant GPU test with the stage fit (its summary
# line; the previous call's run was cut by its timeout after the last test), then exact vs fast
# decode on 8 Llama-3.1-8B layers at batch 64 (fast mode now runs the k_trip 4 rows; exact mode
# never runs the decode kernel). Results: $OUT/h14p.tgz.
set -u
R=/tmp/h14p
mkdir -p "$R"
export OMP_NUM_THREADS=4 TRITON_PRINT_AUTOTUNING=0
stage() { echo "=== $1 ($(date -u +%T))"; }
source benchmarks/device_env.sh || exit 1
stage variant-test
timeout 150 python3 -m pytest -q -p no:cacheprovider -m gpu tests/fp8_kernels/test_fused_gpu.py \
  -k "loop_variants or default_decode_dispatch" 2>&1 | tail -3 | tee "$R/variant-test.txt"
stage exact-vs-fast
for ex in "" --exact; do
  timeout 90 python3 benchmarks/rollout.py --layers 8 --batch 64 --gen 512 --graphs on \
    --modes unified_fp8 $ex --out "$R" --tag "rollout-8l${ex:+-exact}" 2>&1 | grep '^row'
done
tar czf "${OUT:-/tmp}/h14p.tgz" -C "$R" .
stage done
