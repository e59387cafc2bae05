#!/usr/bin/env bash
# Issue 15's H200 acceptance in one device call (TP = PP = 1): GPU tests, GRPO loop, step time.
#
#   bash benchmarks/megatron_gpu_all.sh [stage ...]  # stages: tests loop time
#
# Run from the repository root with megatron-core's wheel in .whl-megatron/ (git-ignored; the
# device has no package index). Output goes to $OUT or benchmarks/results/run/.
set -u
source benchmarks/device_env.sh || exit 1
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/fp8rl-site \
  .whl-megatron/*.whl 2>&1 | grep -v WARNING
python3 -c "import megatron.core, torch; print('megatron-core', megatron.core.__version__)"
R=${OUT:-benchmarks/results/run}
mkdir -p "$R"
export OMP_NUM_THREADS=4 TRITON_PRINT_AUTOTUNING=0 PYTHONWARNINGS=ignore
for s in ${*:-tests loop time}; do
  echo "=== $s ($(date -u +%T))"
  case $s in
  tests)
    timeout "${T_TESTS:-170}" python3 -m pytest -q -p no:cacheprovider -m gpu -s \
      tests/megatron/test_megatron_gpu.py tests/megatron/test_trainer.py 2>&1 \
      | grep --line-buffered -v "^\s*$" | tee "$R/megatron-gpu-tests.txt" | tail -40 ;;
  loop)
    timeout "${T_LOOP:-100}" python3 benchmarks/megatron_gpu_loop.py --steps "${STEPS:-3}" \
      --exact ${EXACT:-true} --out "$R" 2>&1 | grep -v "^{\|Unknown MLP" | tail -20 ;;
  time)
    timeout "${T_TIME:-70}" python3 benchmarks/megatron_step_time.py cuda small-llama 32 64 192 \
      2>&1 | grep "seconds/step" | tee "$R/megatron-step-time.txt" ;;
  esac
done
