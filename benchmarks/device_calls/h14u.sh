#!/usr/bin/env bash
# Issue 14, 2026-12-04 (evening), after h14t.sh: the engine keeps its decode graphs between
# generate calls; the FP8-cache forward runs 3 pipeline stages. `bash benchmarks/device_calls/h14u.sh 1|2`.
#   1: GPU tests (kept graphs after an in-place weight update, graph vs eager, parity, the
#      attention kernel's FP8 rows and fast/exact rows, the loop with an FP8 KV cache), then a
#      32-layer decode at gen 512, batch 64/256, FP8 and BF16 (first and second call of a shape)
#   2: gen 4096 at batch 64: BF16, FP8 with BF16 KV, FP8 with FP8 KV; the decode attention
#      micro-benchmark
# Results: $OUT/h14u-<call>.tgz.
set -u
CALL=${1:-1}
R=/tmp/h14u-$CALL
mkdir -p "$R"
export OMP_NUM_THREADS=4 TRITON_PRINT_AUTOTUNING=0
stage() { echo "=== $1 ($(date -u +%T))"; }
source benchmarks/device_env.sh || exit 1
decode() {  # $1 = tag, $2 = timeout, rest = rollout.py arguments
  local tag=$1 limit=$2; shift 2
  timeout "$limit" python3 benchmarks/rollout.py --graphs on --out "$R" --tag "$tag" "$@" 2>&1 \
    | grep '^row\|Error' | sed "s/^/$tag /"
}
if [ "$CALL" = 1 ]; then
  stage tests
  timeout 260 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_graph_decode_gpu.py \
    tests/fp8_kernels/test_exact_triton_gpu.py tests/gpu/test_parity_gpu.py \
    tests/gpu/test_loop_gpu.py > "$R/gpu-tests.txt" 2>&1
  grep -E "passed|failed|Error|assert" "$R/gpu-tests.txt" | tail -12
  stage decode
  for mode in unified_fp8 bf16; do
    decode "$mode" 150 --gen 512 --batch 64 256 --modes $mode
  done
else
  stage gen4096
  decode gen4096 420 --gen 4096 --batch 64 --kv bf16 fp8 --modes bf16 unified_fp8
  stage micro
  timeout 90 python3 benchmarks/decode_attention.py --no-sweep --out "$R" 2>&1 | grep '^|'
fi
tar czf "${OUT:-/tmp}/h14u-$CALL.tgz" -C "$R" .
stage done
