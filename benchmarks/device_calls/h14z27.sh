#!/usr/bin/env bash
# Issue 14, 2026-12-05 (fifth session): a tile pairing from attention_mma_v2.py (h14z26) tried in
# the engine and the trainer without committing it. TILES="trainer rows,warps[;decode rows,warps]"
# (e.g. "32,4;16,2") is set on attention_exact_triton (BLOCK_M, NUM_WARPS, PAIRED_DECODE_TILES;
# FP8_KV_MAXNREG off) before (1) the GPU tests of attention rows and engine-vs-trainer parity,
# (2) decode at gen 1,024, batch 64, 16 layers, BF16 and unified FP8 + FP8 KV, (3) the 16K-token
# train step, each also run on the committed tiles for the A/B. Results in place under
# $OUT/h14z27/, tables last.
set -u
R=${OUT:-/tmp}/h14z27
mkdir -p "$R"
export OMP_NUM_THREADS=4 TRITON_PRINT_AUTOTUNING=0
stage() { echo "=== $1 ($(date -u +%T))"; }
source benchmarks/device_env.sh || exit 1
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv,noheader
TILES=${TILES:-32,4;16,2}
train=${TILES%%;*}; dec=${TILES#*;}; [ "$dec" = "$TILES" ] && dec=None || dec="($dec)"
prelude="from fp8rl.kernels import attention_exact_triton as a
a.BLOCK_M, a.NUM_WARPS = $train
a.PAIRED_DECODE_TILES, a.FP8_KV_MAXNREG = $dec, None"
echo "tiles: trainer ($train), decode $dec"
with() {  # $1 = 0 committed / 1 the pairing, $2 = time limit, $3 = script, rest = arguments
  local on=$1 limit=$2 script=$3; shift 3
  timeout "$limit" python3 -c "$( [ "$on" = 1 ] && echo "$prelude")
import sys, runpy
sys.argv = ['$script'] + sys.argv[1:]
runpy.run_path('$script', run_name='__main__')" "$@"
}
stage tests
timeout 170 python3 -c "$prelude
import sys, pytest
sys.exit(pytest.main(['-q', '-p', 'no:cacheprovider', 'tests/fp8_kernels/test_exact_triton_gpu.py',
  'tests/gpu/test_parity_gpu.py', 'tests/gpu/test_loop_gpu.py', 'tests/gpu/test_graph_decode_gpu.py']))" \
  > "$R/gpu-tests.txt" 2>&1
echo "pytest rc=$?" >> "$R/gpu-tests.txt"
stage decode
for on in 1 0; do
  for run in "unified_fp8 fp8" "bf16 bf16"; do
    set -- $run
    with $on 90 benchmarks/rollout.py --layers 16 --gen 1024 --batch 64 --graphs on \
      --modes "$1" --kv "$2" --out "$R" --tag "gen1024-$1-kv$2-pair$on" 2>&1 \
      | grep '^row\|Error' | sed "s/^/pair=$on /" | tee -a "$R/decode.txt"
  done
done
stage train
for on in 1 0; do
  with $on 60 benchmarks/train_step.py --layers 8 --tokens 16384 --out "$R" 2>&1 \
    | grep -v '^{' | tail -4 | sed "s/^/pair=$on /" | tee -a "$R/train.txt"
done
stage done
grep -E "passed|failed|rc=" "$R/gpu-tests.txt" | tail -4
