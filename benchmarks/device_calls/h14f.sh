#!/usr/bin/env bash
# Issue 14, 2026-12-03 evening: DGrad's transposed FP8 weight by the tiled Triton transpose
# (kernels.transpose_triton) on top of the grouped q/k/v and gate/up. A/B of the train step in
# one call: this tree with the grouping on and off, and the tree of the last commit before both
# changes (carried in .alt/, git-ignored); the 2K step's kernel table; the fast-mode mismatch;
# every GPU test. Results come back as one archive ($OUT/h14f.tgz).
set -u
R=/tmp/h14f
mkdir -p "$R/new-2048" "$R/new-16384" "$R/base-2048" "$R/base-16384"
export OMP_NUM_THREADS=4 TRITON_PRINT_AUTOTUNING=0
stage() { echo "=== $1 ($(date -u +%T))"; }
ROOT=$PWD
source benchmarks/device_env.sh || exit 1
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/fp8rl-site \
  .whl-megatron/*.whl 2>&1 | grep -v WARNING
stage new-train
timeout 100 python3 benchmarks/train_step.py --layers 8 --tokens 2048 --seq 2048 --grouped on off \
  --steps 5 --profile --out "$R/new-2048" 2>&1 | grep '^|'
timeout 120 python3 benchmarks/train_step.py --layers 8 --tokens 16384 --grouped on off \
  --out "$R/new-16384" 2>&1 | grep '^|'
stage base-train
(cd .alt && source benchmarks/device_env.sh >/dev/null \
  && timeout 60 python3 benchmarks/train_step.py --layers 8 --tokens 2048 --seq 2048 --steps 5 \
     --out "$R/base-2048" 2>&1 | grep '^|' \
  && timeout 90 python3 benchmarks/train_step.py --layers 8 --tokens 16384 \
     --out "$R/base-16384" 2>&1 | grep '^|')
cd "$ROOT" && source benchmarks/device_env.sh >/dev/null
stage mismatch
timeout 150 python3 benchmarks/mismatch_attribution.py --variants committed --seeds 0 1 --out "$R" \
  2>&1 | grep -A6 'token_mult_prob_error |'
stage tests
timeout 330 python3 -m pytest -q -p no:cacheprovider -m gpu tests/fp8_kernels tests/gpu \
  tests/megatron/test_megatron_gpu.py tests/megatron/test_trainer.py 2>&1 | tail -4 \
  | tee "$R/all-gpu-tests.txt"
tar czf "${OUT:-/tmp}/h14f.tgz" -C "$R" .
stage done
