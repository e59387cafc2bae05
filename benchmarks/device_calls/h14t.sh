#!/usr/bin/env bash
# Issue 14, 2026-12-04 (evening): fast mode's attention on the invariant Triton kernel (the one
# exact mode runs), the KV cache (BF16 or FP8) read in place. `bash benchmarks/device_calls/h14t.sh 1|2`.
#   1: GPU tests (the FP8-in-place rows, fast vs exact kernel, parity, graph decode), the decode
#      attention micro-benchmark, a 32-layer decode A/B at gen 512 (triton vs sdpa, FP8 and BF16)
#   2: gen 4096 (BF16 KV / FP8 KV), train_step.py A/B at 16K tokens, the fast-mode mismatch
#      (triton vs sdpa attention, 2 seeds)
# Results: $OUT/h14t-<call>.tgz.
set -u
CALL=${1:-1}
R=/tmp/h14t-$CALL
mkdir -p "$R"
export OMP_NUM_THREADS=4 TRITON_PRINT_AUTOTUNING=0
stage() { echo "=== $1 ($(date -u +%T))"; }
source benchmarks/device_env.sh || exit 1
decode() {  # $1 = tag, rest = rollout.py arguments
  local tag=$1; shift
  timeout ${DECODE_TIMEOUT:-150} python3 benchmarks/rollout.py --graphs on --out "$R" --tag "$tag" "$@" 2>&1 \
    | grep '^row\|Error' | sed "s/^/$tag /"
}
if [ "$CALL" = 1 ]; then
  stage tests
  timeout 240 python3 -m pytest -q -p no:cacheprovider tests/fp8_kernels/test_exact_triton_gpu.py \
    tests/gpu/test_parity_gpu.py tests/gpu/test_graph_decode_gpu.py \
    tests/fp8_kernels/test_decode_attention_gpu.py > "$R/gpu-tests.txt" 2>&1
  grep -E "passed|failed|Error|assert" "$R/gpu-tests.txt" | tail -12
  stage micro
  timeout 90 python3 benchmarks/decode_attention.py --no-sweep --out "$R" 2>&1 | grep '^|'
  stage decode
  for mode in unified_fp8 bf16; do
    for att in triton sdpa; do
      decode "$mode-$att" --gen 512 --batch 64 256 --modes $mode --attention $att
    done
  done
  decode "unified_fp8-triton-2" --gen 512 --batch 64 256 --modes unified_fp8 --attention triton
else
  stage gen4096
  DECODE_TIMEOUT=280 decode gen4096 --gen 4096 --batch 64 --kv bf16 fp8 --modes bf16 unified_fp8
  stage train
  for att in triton sdpa; do
    timeout 150 python3 benchmarks/train_step.py --tokens 16384 --attention $att --out "$R/train-$att" \
      2>&1 | grep '^|' | sed "s/^/$att /"
  done
  stage mismatch
  timeout 200 python3 benchmarks/mismatch_attribution.py --variants committed "attention on SDPA" \
    --seeds 0 1 --out "$R" 2>&1 | grep '^|'
fi
tar czf "${OUT:-/tmp}/h14t-$CALL.tgz" -C "$R" .
stage done
