#!/usr/bin/env bash
# One device call: the trainer step with the fast RMSNorm/SiLU·mul on the fused kernels' Triton
# arithmetic (committed) vs the torch ops (before), BF16 and unified FP8, 8 layers, 16K tokens.
set -u
source benchmarks/device_env.sh || exit 1
export OMP_NUM_THREADS=4
timeout 150 python3 - <<'PY'
import dataclasses, sys, torch
sys.path.insert(0, "benchmarks")
from train_step import measure
from fp8rl.kernels import fused, invariant
from fp8rl.workers.model.config import PRESETS

cfg = dataclasses.replace(PRESETS["llama-3.1-8b"], num_hidden_layers=8)
fast = (invariant.rms_norm_fast, invariant.silu_mul_fast)
torch_ops = (fused.rms_norm_reference, lambda g, u: torch.nn.functional.silu(g) * u)
rows = []
for rep in range(2):
    for name, ops in (("committed", fast), ("torch ops", torch_ops)):
        invariant.rms_norm_fast, invariant.silu_mul_fast = ops
        for mode in ("bf16", "unified_fp8"):
            r = measure(cfg, mode, 16384, 4096, 3, False, False)
            rows.append((name, mode, rep, r["step_s"], r["peak_gib"]))
            print(rows[-1], flush=True)
print("| trainer norm/SiLU | mode | rep | step s | peak GiB |\n|---|---|---|---|---|")
for n, m, rep, s, p in rows:
    print(f"| {n} | {m} | {rep} | {s:.3f} | {p:.1f} |")
PY
