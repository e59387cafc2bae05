#!/usr/bin/env bash
# Issue 14, 2026-12-05 (fourth session), the call after h14z20: the FP8-cache attention with V
# dequantized after Q·Kᵀ under a 168-register cap (attention_exact_triton.FP8_KV_LATE_V /
# FP8_KV_MAXNREG, set here for the A/B without a code change). (1) The GPU tests that read an FP8
# cache in place (bitwise vs the trainer's rows, graphs across weight updates) with the variant on;
# (2) 32-layer decode at gen 4096, batch 64: BF16, unified FP8 + FP8 KV committed, and with the
# variant. Results: $OUT/h14z21.tgz.
set -u
R=/tmp/h14z21
mkdir -p "$R"
export OMP_NUM_THREADS=4 TRITON_PRINT_AUTOTUNING=0
stage() { echo "=== $1 ($(date -u +%T))"; }
source benchmarks/device_env.sh || exit 1
LATE=${LATE:-True} CAP=${CAP:-168} ST=${ST:-3}
variant="from fp8rl.kernels import attention_exact_triton as a
a.FP8_KV_LATE_V, a.FP8_KV_MAXNREG, a.FP8_KV_STAGES = $LATE, $CAP, $ST"
stage tests
python3 -c "$variant
import sys, pytest
sys.exit(pytest.main(['-q', '-p', 'no:cacheprovider',
  'tests/fp8_kernels/test_exact_triton_gpu.py::test_fp8_cache_read_in_place_gives_the_round_tripped_rows_bitwise',
  'tests/gpu/test_graph_decode_gpu.py', 'tests/fp8_kernels/test_decode_attention_gpu.py']))" \
  > "$R/gpu-tests-variant.txt" 2>&1
grep -E "passed|failed|Error|assert" "$R/gpu-tests-variant.txt" | tail -6
decode() {  # $1 = tag, $2 = timeout, $3 = variant 0/1, rest = rollout.py arguments
  local tag=$1 limit=$2 on=$3; shift 3
  timeout "$limit" python3 -c "$( [ "$on" = 1 ] && echo "$variant")
import sys, runpy
sys.argv = ['rollout.py'] + sys.argv[1:]
runpy.run_path('benchmarks/rollout.py', run_name='__main__')" \
    --graphs on --out "$R" --tag "$tag" "$@" 2>&1 | grep '^row\|Error' | sed "s/^/$tag /"
}
stage gen4096
decode gen4096-fp8kv-variant 170 1 --gen 4096 --batch 64 --kv fp8 --modes unified_fp8
decode gen4096-fp8kv-committed 170 0 --gen 4096 --batch 64 --kv fp8 --modes unified_fp8
decode gen4096-bf16 170 0 --gen 4096 --batch 64 --kv bf16 --modes bf16
tar czf "${OUT:-/tmp}/h14z21.tgz" -C "$R" .
stage done
