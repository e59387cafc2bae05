#!/usr/bin/env bash
# Every issue-14 GPU test and benchmark in one device call (H200), short tables last.
#
#   bash benchmarks/gpu_all.sh [stage ...]  # stages: tests attn rope cpu parity mismatch tune rollout kv train gemms checks exact
#
# Run from the repository root (device_env.sh makes it importable as fp8rl). Results go to $OUT
# (the device call's output folder) or benchmarks/results/run/. Each stage has its own time
# limit so one slow stage cannot eat the whole call.
set -u
source benchmarks/device_env.sh || exit 1
R=${OUT:-benchmarks/results/run}
mkdir -p "$R"
export OMP_NUM_THREADS=4 TRITON_PRINT_AUTOTUNING=0
STAGES=${*:-tests attn parity tune rollout train exact}
stage() { echo "=== $1 ($(date -u +%T))"; }
for s in $STAGES; do
  case $s in
  tests)
    stage tests
    timeout 100 python3 -m pytest -q -p no:cacheprovider -m gpu tests/fp8_kernels/test_fused_gpu.py tests/fp8_kernels/test_finite_checks_gpu.py \
      tests/fp8_kernels/test_kernels_gpu.py 2>&1 | tail -25 | tee "$R/tests.txt" ;;
  attn)
    stage attn
    timeout 90 python3 -m pytest -q -p no:cacheprovider -m gpu tests/fp8_kernels/test_decode_attention_gpu.py \
      2>&1 | tail -12 | tee "$R/attn-tests.txt"
    timeout 60 python3 benchmarks/decode_attention.py --out "$R" 2>&1 | grep -v '^{' | tail -40 ;;
  rope)
    stage rope
    timeout 90 python3 -m pytest -q -p no:cacheprovider -m gpu tests/fp8_kernels/test_rope_kv_gpu.py \
      2>&1 | tail -6 | tee "$R/rope-tests.txt"
    timeout 200 python3 benchmarks/rollout.py --batch 64 256 --gen 512 --graphs on --rope-kv on off \
      --out "$R" --tag rollout-rope 2>&1 | grep -v '^{' | tail -12
    timeout 100 python3 benchmarks/rollout.py --layers 8 --batch 64 --gen 512 --graphs on \
      --modes unified_fp8 --kv fp8 --rope-kv on off --out "$R" --tag rollout-rope-fp8kv 2>&1 \
      | grep -v '^{' | tail -5 ;;
  cpu)
    stage cpu
    timeout 120 python3 benchmarks/cpu_overhead.py --out "$R" 2>&1 | tail -16 ;;
  parity)
    stage parity
    timeout 200 python3 -m pytest -q -p no:cacheprovider -m gpu tests/gpu 2>&1 | tail -15 \
      | tee "$R/parity-tests.txt" ;;
  mismatch)
    stage mismatch
    timeout 100 python3 benchmarks/mismatch_attribution.py --seeds 0 1 --out "$R" 2>&1 \
      | grep -v '^{"model' | tail -40 ;;
  tune)
    stage tune
    timeout 150 python3 benchmarks/gemm_tune.py --table kernels/fp8_gemm_decode_table.json \
      --out "$R" 2>&1 | grep -v "^  N=" | tail -60
    cp kernels/fp8_gemm_decode_table.json "$R/" 2>/dev/null ;;
  rollout)
    stage rollout
    timeout 150 python3 benchmarks/rollout.py --batch 64 256 --gen 512 --graphs on \
      --decode-attn on off --out "$R" --tag rollout-gen512 2>&1 | grep -v '^{' | tail -12 ;;
  kv)
    stage kv
    timeout 420 python3 benchmarks/rollout.py --layers 8 --batch 64 --gen 4096 --graphs on \
      --kv bf16 fp8 --decode-attn on off --out "$R" --tag rollout-gen4096 2>&1 | grep -v '^{' | tail -20 ;;
  train)
    stage train
    timeout 150 python3 benchmarks/train_step.py --layers 8 --tokens 16384 32768 --checks deferred sync --profile \
      --out "$R" 2>&1 | grep -v '^{' | tail -40 ;;
  gemms)
    stage gemms
    timeout 200 python3 benchmarks/kernels.py --only-gemms --out "$R" 2>&1 | grep -v '^  ' | tail -60 ;;
  checks)
    stage checks
    timeout 100 python3 benchmarks/gpu_checks.py --out "$R" 2>&1 | tail -25 ;;
  exact)
    stage exact
    timeout 120 python3 -m pytest -q -p no:cacheprovider -m gpu tests/fp8_kernels/test_exact_triton_gpu.py \
      2>&1 | tail -8 | tee "$R/exact-tests.txt"
    timeout 120 python3 benchmarks/train_step.py --layers 8 --tokens 16384 --modes unified_fp8 \
      --exact --out "$R" 2>&1 | grep -v '^{' | tail -8
    for ex in "" --exact; do
      timeout 90 python3 benchmarks/rollout.py --layers 8 --batch 64 --gen 512 --graphs on \
        --modes unified_fp8 $ex --out "$R" --tag "rollout${ex:+-exact}" 2>&1 | grep -v '^{' | tail -3
    done ;;
  esac
done
stage done
