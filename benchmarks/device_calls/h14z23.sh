#!/usr/bin/env bash
# Issue 14, 2026-12-05 (fourth session), written after h14z22: the FP8-cache forward with 8 warps
# over the same 64x64 tiles (each thread dequantizes half as much; under a 128-register cap two
# programs per SM, 16 warps, no spills in the sm_90 compile), against the committed 4-warp
# binary (late_v, cap 168). Each variant is checked bitwise against the trainer's 4-warp BF16 path
# on random inputs; a winner also needs the GPU tests on model activations. ~1 min. Ran 10:55 UTC on
# an H100: 1.5-2x slower (results doc); the 8-warp variants exist only at 03423be, run it from there.
set -u
source benchmarks/device_env.sh || exit 1
cd benchmarks && timeout 150 python3 attention_fp8_tune.py --shapes 64x2176 64x4160 256x2176 \
  --variants 4 8 9 10 11 2>&1 | sed -n '/^| batch | keys | variant/,$p'
