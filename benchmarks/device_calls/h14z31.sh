#!/usr/bin/env bash
# Issue 14, 2026-12-05 (eighth session), third call: the committed tree's targets on an H200
# (h14z29 ran on an H100, and its decode rows with the o_proj-quant epilogue that h14z30 measured
# slower and that was dropped): h14z25.sh's stages (32-layer decode at gen 512, batch 64 / 256,
# BF16 and FP8 caches; the 16K train step with exact mode; 32-layer gen 4,096), then tests/gpu.
# The recorded run (`results/issue14/h200-1205e-targets/`) ran those stages inline, with 10-20 s
# shorter limits, writing under h14z31/; this runs them from h14z25.sh (results under h14z25/).
bash benchmarks/device_calls/h14z25.sh
CALL=h14z31
source benchmarks/device_calls/preamble.sh
stage tests
timeout 120 python3 -m pytest -q -p no:cacheprovider -m gpu tests/gpu -rf > "$R/gpu-tests.txt" 2>&1
echo "pytest rc=$?" >> "$R/gpu-tests.txt"
grep -E "^FAILED|passed|failed|rc=" "$R/gpu-tests.txt" | tail -5
