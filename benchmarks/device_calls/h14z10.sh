#!/usr/bin/env bash
# Issue 14, 2026-12-05: the attention backward's tiles. h14z9 showed 12.49 ms (default 64×64,
# 8 warps, 2 stages, both kernels) against 7.09 ms (128×128) per layer at the 16K step's shape,
# gradients bitwise the default's; the dK/dV and dQ kernels were 103 of the FP8 step's 506 ms.
# This call sweeps each kernel's tiles on its own (dQ first, then dK/dV at the best dQ), then
# runs the 16K train step (bf16, unified FP8, exact; profiled) with the best pair patched in.
# Results: $OUT/h14z10.tgz. Run from the repository root: bash benchmarks/device_calls/h14z10.sh
set -u
R=/tmp/h14z10
mkdir -p "$R"
export OMP_NUM_THREADS=4 TRITON_PRINT_AUTOTUNING=0
stage() { echo "=== $1 ($(date -u +%T))"; }
source benchmarks/device_env.sh || exit 1
stage attention-bwd-sweep
timeout 240 python3 benchmarks/attention_exact_sweep.py > "$R/attention-sweep.txt" 2>&1
grep -E '^\| (sdpa|bwd)|^best' "$R/attention-sweep.txt" | cut -c1-110
BEST=$(grep '^best' "$R/attention-sweep.txt" | sed 's/^best: //')
stage "train with $BEST"
timeout 240 python3 -c "
import runpy, sys
from fp8rl.kernels import attention_exact_triton as m
${BEST//, DKDV/; m.DKDV}
m.DQ_TILES = DQ_TILES
sys.argv = ['train_step.py', '--layers', '8', '--tokens', '16384', '--exact', '--profile',
            '--out', '$R']
runpy.run_path('benchmarks/train_step.py', run_name='__main__')
" > "$R/train.log" 2>&1
grep -E '^\||Error' "$R/train.log" | tail -8
grep -E '_bwd_(dq|dkdv)_kernel' "$R/train.log" | head -6
tar czf "${OUT:-/tmp}/h14z10.tgz" -C "$R" .
stage done
