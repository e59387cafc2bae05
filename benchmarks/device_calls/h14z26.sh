#!/usr/bin/env bash
# Issue 14, 2026-12-05 (fifth session): (1) attention_mma_v2.py: can the trainer and decode both
# run mma.sync tiles so decode reads its KV cache with 16-row tiles and keeps the trainer's bits
# (pairs A/B; C is the wgmma-vs-mma.sync control, E the trainer's 32-row tiles for decode too),
# and what do they cost (decode calls over BF16 / FP8 caches, the trainer forward); (2) the
# engine-vs-trainer parity GPU tests (tests/gpu) on this tree. Results written in place under
# $OUT/h14z26/ (a call cut by its limit still returns them), tables last.
CALL=h14z26
source benchmarks/device_calls/preamble.sh
stage mma-v2
(cd benchmarks && timeout 280 python3 attention_mma_v2.py) > "$R/attention-mma-v2.txt" 2>&1
stage parity-tests
timeout 150 python3 -m pytest -q -p no:cacheprovider -m gpu tests/gpu > "$R/gpu-tests.txt" 2>&1
echo "pytest rc=$?" >> "$R/gpu-tests.txt"
stage done
grep -E "passed|failed|rc=" "$R/gpu-tests.txt" | tail -4
sed -n '/^| pair | cache/,$p' "$R/attention-mma-v2.txt"
grep -E "Error|error" "$R/attention-mma-v2.txt" | head -5
