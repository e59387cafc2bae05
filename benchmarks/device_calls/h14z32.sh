#!/usr/bin/env bash
# Issue 14, 2026-12-05 (eighth session), fourth call, H200: the linear table (`kernels.py
# --only-gemms`: fp8_linear incl. the 1x128 quant at M = 1-256 and the GEMMs at M >= 4,096, 8B/7B
# shapes) and exact against fast mode at the 8-layer batch-64 decode. Results in place under
# $OUT/h14z32/, tables last.
CALL=h14z32
source benchmarks/device_calls/preamble.sh
stage exact-vs-fast
for flag in "" "--exact"; do
  timeout 90 python3 benchmarks/rollout.py --layers 8 --batch 64 --gen 512 --graphs on \
    --modes unified_fp8 $flag --out "$R" --tag "8L${flag:+-exact}" >> "$R/exact-vs-fast.txt" 2>&1
done
stage gemms
timeout 300 python3 benchmarks/kernels.py --only-gemms --out "$R" > "$R/kernels.txt" 2>&1
stage done
grep '^row\|Error' "$R/exact-vs-fast.txt"
grep -hE '^\| llama|^\| qwen' "$R"/*.md | awk -F'|' '{print $3,$4,$5,$6,$8,$11,$12}' | head -60
