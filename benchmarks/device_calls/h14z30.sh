#!/usr/bin/env bash
# Issue 14, 2026-12-05 (eighth session), second call: o_proj's 1x128 quantization in the
# attention kernel's epilogue (`invariant.attention_quantized`, the engine's fused blocks at head
# size 128). (1) Every GPU test the device can run (`tests/fp8_kernels tests/gpu`), with the new
# epilogue tests (codes bitwise the quantizer's; a 128-wide-head model's exact engine bitwise
# the trainer, either mode unchanged by the epilogue). (2) Decode, 32 layers, gen 512, batch 64
# and 256, CUDA graphs: BF16 and unified FP8 (BF16 and FP8 caches), epilogue on and off.
# Results in place under $OUT/h14z30/, tables last.
CALL=h14z30
source benchmarks/device_calls/preamble.sh
stage tests
timeout 330 python3 -m pytest -q -p no:cacheprovider -m gpu tests/fp8_kernels/test_exact_triton_gpu.py \
  tests/gpu/test_parity_gpu.py tests/fp8_kernels tests/gpu -rf \
  > "$R/gpu-tests.txt" 2>&1
echo "pytest rc=$?" >> "$R/gpu-tests.txt"
stage gen512
timeout 230 python3 benchmarks/rollout.py --gen 512 --batch 64 256 --graphs on \
  --modes bf16 unified_fp8 --kv bf16 fp8 --o-quant on off --out "$R" --tag gen512-32L \
  > "$R/gen512.txt" 2>&1
stage done
grep -E "^FAILED|passed|failed|error|rc=" "$R/gpu-tests.txt" | tail -12
grep '^row\|Error' "$R/gen512.txt"
