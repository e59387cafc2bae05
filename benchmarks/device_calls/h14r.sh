#!/usr/bin/env bash
# Issue 14, 2026-12-04 (afternoon): the draw and logprob inside the decode step's CUDA graph and
# the host one step behind. GPU tests (graph vs eager engine bitwise; parity), then a 32-layer
# decode A/B (gen 512, batch 64 and 256; .alt = HEAD before, with this rollout.py's warm-up at
# the timed batch), alternating new/base for FP8 and BF16, twice; then decode_overhead.py on the
# new tree. Results: $OUT/h14r.tgz.
set -u
R=/tmp/h14r
mkdir -p "$R"
export OMP_NUM_THREADS=4 TRITON_PRINT_AUTOTUNING=0
stage() { echo "=== $1 ($(date -u +%T))"; }
ROOT=$PWD
source benchmarks/device_env.sh || exit 1
stage tests
timeout 150 python3 -m pytest -q -x -p no:cacheprovider tests/gpu/test_graph_decode_gpu.py \
  tests/gpu/test_parity_gpu.py -k "graph or fast_unified" > "$R/gpu-tests.txt" 2>&1
tail -4 "$R/gpu-tests.txt"
decode() {  # $1 = tag, rest = rollout.py arguments
  local tag=$1; shift
  timeout 100 python3 benchmarks/rollout.py --gen 512 --graphs on --batch 64 256 --out "$R" \
    --tag "$tag" "$@" 2>&1 | grep '^row' | sed "s/^/$tag /"
}
stage decode
for i in 1 2; do
  for mode in unified_fp8 bf16; do
    decode "new-$mode-$i" --modes $mode
    (cd .alt && source benchmarks/device_env.sh >/dev/null && decode "base-$mode-$i" --modes $mode)
    cd "$ROOT" && source benchmarks/device_env.sh >/dev/null
  done
done
stage overhead
timeout 150 python3 benchmarks/decode_overhead.py --layers 32 --batch 64 256 --gen 512 \
  2>&1 | tee "$R/overhead.txt" | tail -7
tar czf "${OUT:-/tmp}/h14r.tgz" -C "$R" .
stage done
