#!/usr/bin/env bash
# Issue 14, 2026-12-05 (seventh session): h14z26 found decode rows over an FP8 cache differing
# from the trainer's round-tripped rows on heavy-tailed inputs for every tile pairing. (1)
# fp8_kv_bitwise_probe.py isolates the cause (the in-kernel dequantization of every code; kernel
# variants on Student-t inputs); (2) every GPU test the device can run (`-m gpu tests/fp8_kernels tests/gpu`; Megatron needs megatron-core), now with the heavy-tailed
# FP8-cache case. Results in place under $OUT/h14z28/, tables last.
CALL=h14z28
source benchmarks/device_calls/preamble.sh
stage probe
(cd benchmarks && timeout 120 python3 fp8_kv_bitwise_probe.py) > "$R/probe.txt" 2>&1
stage tests
timeout 300 python3 -m pytest -q -p no:cacheprovider -m gpu tests/fp8_kernels tests/gpu -rf > "$R/gpu-tests.txt" 2>&1
echo "pytest rc=$?" >> "$R/gpu-tests.txt"
stage done
grep -E "^FAILED|passed|failed|error|rc=" "$R/gpu-tests.txt" | tail -12
sed -n '/^| dequant check/,$p' "$R/probe.txt"
grep -E "Error|error" "$R/probe.txt" | head -5
