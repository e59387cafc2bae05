#!/usr/bin/env bash
# Issue 14, 2026-12-05 (second session): the trainer's attention backward on cuDNN's SDPA
# backward from the invariant forward's (out, lse) (kernels/attention_cudnn_bwd.py): the A/B table
# (benchmarks/attention_backward_ab.py), the GPU tests (cuDNN vs float64 and Triton), and the 16K
# train step with the cuDNN and the Triton backward. Results: $OUT/h14z17.tgz.
set -u
R=/tmp/h14z17
mkdir -p "$R"
export OMP_NUM_THREADS=4 TRITON_PRINT_AUTOTUNING=0
source benchmarks/device_env.sh || exit 1
(cd benchmarks && timeout 150 python3 attention_backward_ab.py > "$R/backward-ab.txt" 2>&1)
grep -v -i "warn\|run_backward" "$R/backward-ab.txt" | tail -16
timeout 150 python3 -m pytest -q -p no:cacheprovider tests/fp8_kernels/test_exact_triton_gpu.py \
  tests/fp8_kernels/test_attention_cudnn_bwd.py > "$R/gpu-tests.txt" 2>&1
grep -E "passed|failed|Error|assert" "$R/gpu-tests.txt" | tail -6
for bwd in cudnn triton; do
  timeout 220 python3 benchmarks/train_step.py --layers 8 --tokens 16384 --exact \
    --attention-bwd $bwd --out "$R/train-$bwd" > "$R/train-$bwd.log" 2>&1
  grep -E '^\| [bu]|Error' "$R/train-$bwd.log" | tail -4
done
tar czf "${OUT:-/tmp}/h14z17.tgz" -C "$R" .
