#!/usr/bin/env bash
# Issue 14, 2026-12-04 (afternoon): call 3. The whole decode step in its CUDA graph, the draw as
# one Triton kernel (unfiltered sampling), the host one step behind. GPU tests (graph vs eager engine bitwise; parity), then a 32-layer
# decode A/B (gen 512, batch 64 and 256; .alt = HEAD before, with this rollout.py's warm-up at
# the timed batch), alternating new/base for FP8 and BF16, then FP8 again; then decode_overhead.py (batch 64) on
# the new tree; then gen 4096 at batch 64, BF16 and FP8 with BF16 and FP8 KV. Results: $OUT/h14s.tgz.
set -u
R=/tmp/h14s
mkdir -p "$R"
export OMP_NUM_THREADS=4 TRITON_PRINT_AUTOTUNING=0
stage() { echo "=== $1 ($(date -u +%T))"; }
ROOT=$PWD
source benchmarks/device_env.sh || exit 1
stage tests
timeout 200 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_graph_decode_gpu.py \
  tests/gpu/test_parity_gpu.py > "$R/gpu-tests.txt" 2>&1
tail -4 "$R/gpu-tests.txt"
decode() {  # $1 = tag, rest = rollout.py arguments
  local tag=$1; shift
  timeout 100 python3 benchmarks/rollout.py --gen 512 --graphs on --batch 64 256 --out "$R" \
    --tag "$tag" "$@" 2>&1 | grep '^row' | sed "s/^/$tag /"
}
stage decode
for i in 1 2; do
  modes="unified_fp8 bf16"; [ $i = 2 ] && modes=unified_fp8
  for mode in $modes; do
    decode "new-$mode-$i" --modes $mode
    (cd .alt && source benchmarks/device_env.sh >/dev/null && decode "base-$mode-$i" --modes $mode)
    cd "$ROOT" && source benchmarks/device_env.sh >/dev/null
  done
done
stage overhead
timeout 150 python3 benchmarks/decode_overhead.py --layers 32 --batch 64 --gen 512 \
  2>&1 | tee "$R/overhead.txt" | tail -7
stage gen4096
timeout 300 python3 benchmarks/rollout.py --gen 4096 --graphs on --batch 64 --kv bf16 fp8 \
  --out "$R" --tag gen4096 2>&1 | grep '^row'
tar czf "${OUT:-/tmp}/h14s.tgz" -C "$R" .
stage done
