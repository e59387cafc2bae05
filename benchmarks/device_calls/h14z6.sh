#!/usr/bin/env bash
# Issue 14, 2026-12-04 (night), call 7: decode calls over a BF16 cache on 3 pipeline stages
# (attention_exact_triton.DECODE_STAGES). GPU tests; 32-layer decode at gen 512, batch 64/256,
# FP8 and BF16 with 3 and 2 stages (A/B in one call); gen 4096 at batch 64, BF16 vs unified FP8
# with an FP8 KV cache. Results: $OUT/h14z6.tgz.
set -u
R=/tmp/h14z6
mkdir -p "$R"
export OMP_NUM_THREADS=4 TRITON_PRINT_AUTOTUNING=0
stage() { echo "=== $1 ($(date -u +%T))"; }
source benchmarks/device_env.sh || exit 1
decode() {  # $1 = tag, $2 = timeout, $3 = DECODE_STAGES, rest = rollout.py arguments
  local tag=$1 limit=$2 st=$3; shift 3
  timeout "$limit" python3 -c "import sys, runpy
from fp8rl.kernels import attention_exact_triton as a
a.DECODE_STAGES = $st
sys.argv = ['rollout.py'] + sys.argv[1:]
runpy.run_path('benchmarks/rollout.py', run_name='__main__')" \
    --graphs on --out "$R" --tag "$tag" "$@" 2>&1 | grep '^row\|Error' | sed "s/^/$tag /"
}
stage tests
timeout 200 python3 -m pytest -q -p no:cacheprovider tests/fp8_kernels/test_exact_triton_gpu.py \
  tests/gpu/test_parity_gpu.py tests/gpu/test_graph_decode_gpu.py \
  tests/fp8_kernels/test_decode_attention_gpu.py > "$R/gpu-tests.txt" 2>&1
grep -E "passed|failed|Error|assert" "$R/gpu-tests.txt" | tail -12
stage decode
for st in 3 2; do
  for mode in unified_fp8 bf16; do
    decode "$mode-stages$st" 100 $st --gen 512 --batch 64 256 --modes $mode
  done
done
stage gen4096
decode gen4096-bf16 170 3 --gen 4096 --batch 64 --kv bf16 --modes bf16
decode gen4096-fp8kv 170 3 --gen 4096 --batch 64 --kv fp8 --modes unified_fp8
tar czf "${OUT:-/tmp}/h14z6.tgz" -C "$R" .
stage done
