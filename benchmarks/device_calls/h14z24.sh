#!/usr/bin/env bash
# Issue 14, 2026-12-05 (fifth session), first H200 call since the FP8-cache change (V dequantized
# after Q·Kᵀ, 168-register cap; measured only on an H100): (1) every GPU test (`-m gpu tests`,
# 242 collected; the Megatron ones skip on the device), (2) decode at gen 4,096, batch 64, 16
# layers: BF16 against unified FP8 with an FP8 KV cache, the H100's 1.43x setting. Results:
# $OUT/h14z24/, tables last.
CALL=h14z24
source benchmarks/device_calls/preamble.sh
stage tests
timeout 300 python3 -m pytest -q -p no:cacheprovider -m gpu tests > "$R/gpu-tests.txt" 2>&1
echo "pytest rc=$?" >> "$R/gpu-tests.txt"
stage gen4096-16L
for run in "bf16 bf16" "unified_fp8 fp8"; do
  set -- $run
  timeout 130 python3 benchmarks/rollout.py --layers 16 --gen 4096 --batch 64 --graphs on \
    --modes "$1" --kv "$2" --out "$R" --tag "gen4096-16L-$1-kv$2" >> "$R/gen4096-16L.txt" 2>&1
done
stage done
grep -E "passed|failed|error|rc=" "$R/gpu-tests.txt" | tail -6
grep '^row\|Error' "$R/gen4096-16L.txt"
