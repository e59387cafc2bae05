#!/usr/bin/env bash
# Issue 14, 2026-12-05 (eighth session), first call: the committed tree's targets on an H200
# (the seventh session measured only on an H100). (1) Fast-mode mismatch, both numbers: the
# committed engine and the pre-issue-14 one (`mismatch_attribution.py`, seeds 0 and 1). (2)
# Decode, 32 layers, gen 512, batch 64 and 256, CUDA graphs: BF16, unified FP8 with a BF16 and
# an FP8 cache. (3) The 16K-token train step (8 layers, bf16 / unified FP8 / exact), profiled.
# Results written in place under $OUT/h14z29/, tables last.
CALL=h14z29
source benchmarks/device_calls/preamble.sh
stage mismatch
timeout 150 python3 benchmarks/mismatch_attribution.py --seeds 0 1 \
  --variants committed "pre-issue-14 engine" --out "$R" > "$R/mismatch.txt" 2>&1
stage gen512
timeout 200 python3 benchmarks/rollout.py --gen 512 --batch 64 256 --graphs on \
  --modes bf16 unified_fp8 --kv bf16 fp8 --out "$R" --tag gen512-32L > "$R/gen512.txt" 2>&1
stage train
timeout 170 python3 benchmarks/train_step.py --layers 8 --tokens 16384 --exact --profile \
  --out "$R" > "$R/train.txt" 2>&1
stage done
grep -v '^{' "$R/mismatch.txt" | tail -14
grep '^row\|Error' "$R/gen512.txt"
grep -v '^{' "$R/train.txt" | grep -v '^ ' | tail -10
