#!/usr/bin/env bash
# Issue 14, 2026-12-05 (second session): the trainer's attention backward on FA2 from the
# invariant forward's (out, lse): the experiment table, the GPU
# tests (FA2 vs float64 and Triton, exact parity untouched), and the 16K train step with the FA2
# and the Triton backward. Results: $OUT/h14z16.tgz. As run, the module was an FA2 version of
# today's kernels/attention_cudnn_bwd.py (then kernels/attention_flash_bwd.py, experiment
# benchmarks/attention_flash_bwd.py, train_step --attention-bwd fa2|triton); FA2 was no faster
# and was replaced by cuDNN's backward (h14z17.sh), so this script no longer runs as written.
set -u
R=/tmp/h14z16
mkdir -p "$R"
export OMP_NUM_THREADS=4 TRITON_PRINT_AUTOTUNING=0
source benchmarks/device_env.sh || exit 1
(cd benchmarks && timeout 150 python3 attention_backward_ab.py > "$R/flash-bwd.txt" 2>&1)
grep -v Warning "$R/flash-bwd.txt" | tail -9
timeout 150 python3 -m pytest -q -p no:cacheprovider tests/fp8_kernels/test_exact_triton_gpu.py \
  tests/fp8_kernels/test_attention_cudnn_bwd.py > "$R/gpu-tests.txt" 2>&1
grep -E "passed|failed|Error|assert" "$R/gpu-tests.txt" | tail -6
for bwd in fa2 triton; do
  timeout 220 python3 benchmarks/train_step.py --layers 8 --tokens 16384 --exact \
    --attention-bwd $bwd --out "$R/train-$bwd" > "$R/train-$bwd.log" 2>&1
  grep -E '^\| [bu]|Error' "$R/train-$bwd.log" | tail -4
done
tar czf "${OUT:-/tmp}/h14z16.tgz" -C "$R" .
