#!/usr/bin/env bash
# Issue 14, 2026-12-05 (fourth session): h14z20 and h14z21 in one call of < 600 s, for when device
# starts are scarce. (1) The GPU tests of the cuDNN-backward review fixes and the exact parity loop
# (never run on a GPU yet) plus the tests that read an FP8 cache in place, all with the FP8-cache
# variant on (V dequantized after Q·Kᵀ, 168-register cap: attention_exact_triton.FP8_KV_LATE_V /
# FP8_KV_MAXNREG, set here); (2) attention_fp8_tune.py at two shapes, four variants, each checked
# bitwise against the trainer's path; (3) 32-layer decode at gen 4096, batch 64, unified FP8 with
# an FP8 KV cache: the variant and the committed kernel (the BF16 run: 6,240 tok/s on 12-04 night,
# 6,002 on 12-04 afternoon). Results: $OUT/h14z22.tgz.
set -u
R=/tmp/h14z22
mkdir -p "$R"
export OMP_NUM_THREADS=4 TRITON_PRINT_AUTOTUNING=0
stage() { echo "=== $1 ($(date -u +%T))"; }
source benchmarks/device_env.sh || exit 1
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv,noheader
variant="from fp8rl.kernels import attention_exact_triton as a
a.FP8_KV_LATE_V, a.FP8_KV_MAXNREG = True, 168"
stage tests
timeout 170 python3 -c "$variant
import sys, pytest
sys.exit(pytest.main(['-q', '-p', 'no:cacheprovider', 'tests/fp8_kernels/test_exact_triton_gpu.py',
  'tests/fp8_kernels/test_attention_cudnn_bwd.py', 'tests/gpu/test_loop_gpu.py',
  'tests/gpu/test_graph_decode_gpu.py']))" > "$R/gpu-tests-variant-on.txt" 2>&1
grep -E "passed|failed|Error|assert" "$R/gpu-tests-variant-on.txt" | tail -8
stage sweep
(cd benchmarks && timeout 100 python3 attention_fp8_tune.py --shapes 64x4160 256x2176 \
  --variants 2 4 5 7) > "$R/fp8-tune.txt" 2>&1
decode() {  # $1 = tag, $2 = timeout, $3 = variant 0/1, rest = rollout.py arguments
  local tag=$1 limit=$2 on=$3; shift 3
  timeout "$limit" python3 -c "$( [ "$on" = 1 ] && echo "$variant")
import sys, runpy
sys.argv = ['rollout.py'] + sys.argv[1:]
runpy.run_path('benchmarks/rollout.py', run_name='__main__')" \
    --graphs on --out "$R" --tag "$tag" "$@" 2>&1 | grep '^row\|Error' | sed "s/^/$tag /"
}
stage gen4096
decode gen4096-fp8kv-variant 140 1 --gen 4096 --batch 64 --kv fp8 --modes unified_fp8
decode gen4096-fp8kv-committed 140 0 --gen 4096 --batch 64 --kv fp8 --modes unified_fp8
tar czf "${OUT:-/tmp}/h14z22.tgz" -C "$R" .
stage done
sed -n '/^| batch | keys | variant/,$p' "$R/fp8-tune.txt" | tail -12
