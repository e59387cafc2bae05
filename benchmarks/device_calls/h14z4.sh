#!/usr/bin/env bash
# Issue 14, 2026-12-04 (night), call 5: visible-key counts built once per forward; 16-row decode
# attention tiles opt-in (set_fast_attention("triton_decode16")). GPU tests; 32-layer decode at
# gen 512, batch 64/256, FP8 and BF16, default and decode tiles; fast-mode mismatch with both.
# Results: $OUT/h14z4.tgz.
set -u
R=/tmp/h14z4
mkdir -p "$R"
export OMP_NUM_THREADS=4 TRITON_PRINT_AUTOTUNING=0
stage() { echo "=== $1 ($(date -u +%T))"; }
source benchmarks/device_env.sh || exit 1
decode() {  # $1 = tag, $2 = timeout, rest = rollout.py arguments
  local tag=$1 limit=$2; shift 2
  timeout "$limit" python3 benchmarks/rollout.py --graphs on --out "$R" --tag "$tag" "$@" 2>&1 \
    | grep '^row\|Error' | sed "s/^/$tag /"
}
stage tests
timeout 200 python3 -m pytest -q -p no:cacheprovider tests/fp8_kernels/test_exact_triton_gpu.py \
  tests/gpu/test_parity_gpu.py tests/gpu/test_graph_decode_gpu.py \
  tests/fp8_kernels/test_decode_attention_gpu.py > "$R/gpu-tests.txt" 2>&1
grep -E "passed|failed|Error|assert" "$R/gpu-tests.txt" | tail -12
stage decode
for attn in triton triton_decode16; do
  for mode in unified_fp8 bf16; do
    decode "$mode-$attn" 120 --gen 512 --batch 64 256 --modes $mode --attention $attn
  done
done
stage mismatch
timeout 150 python3 benchmarks/mismatch_attribution.py --variants committed "decode tiles" \
  --seeds 0 1 --out "$R" 2>&1 | grep '^|'
tar czf "${OUT:-/tmp}/h14z4.tgz" -C "$R" .
stage done
