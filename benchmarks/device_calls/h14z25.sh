#!/usr/bin/env bash
# Issue 14, 2026-12-05 (fifth session), second H200 call: the decode and train targets on one
# tree in one call. (1) Decode, 32 layers, gen 512, batch 64 and 256, CUDA graphs: BF16, unified
# FP8 with a BF16 cache, unified FP8 with an FP8 cache. (2) The 16K-token train step (8 layers,
# bf16 / unified FP8, exact too). (3) Decode, 32 layers, gen 4,096, batch 64: BF16 against
# unified FP8 + FP8 KV (the H200 holds BF16 at 32 layers; the H100 did not). Results written in
# place under $OUT/h14z25/ (a call cut by its limit still returns them), tables last.
CALL=h14z25
source benchmarks/device_calls/preamble.sh
stage gen512
timeout 180 python3 benchmarks/rollout.py --gen 512 --batch 64 256 --graphs on \
  --modes bf16 unified_fp8 --kv bf16 fp8 --out "$R" --tag gen512-32L > "$R/gen512.txt" 2>&1
stage train
timeout 100 python3 benchmarks/train_step.py --layers 8 --tokens 16384 --exact \
  --out "$R" > "$R/train.txt" 2>&1
stage gen4096-32L
for run in "unified_fp8 fp8" "bf16 bf16"; do
  set -- $run
  timeout 140 python3 benchmarks/rollout.py --gen 4096 --batch 64 --graphs on \
    --modes "$1" --kv "$2" --out "$R" --tag "gen4096-32L-$1-kv$2" >> "$R/gen4096-32L.txt" 2>&1
done
stage done
grep '^row\|Error' "$R/gen512.txt" "$R/gen4096-32L.txt"
grep -v '^{' "$R/train.txt" | tail -8
