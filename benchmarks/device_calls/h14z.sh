#!/usr/bin/env bash
# Issue 14, 2026-12-04 (night): (1) can a decode call run the invariant attention on a 16-row
# tile bitwise (attention_decode_tile.py); (2) gate_up decode GEMM rows with the k_trip loop
# variants at M = 1-64 (never swept for gate_up). Results: $OUT/h14z.tgz.
set -u
R=/tmp/h14z
mkdir -p "$R"
export OMP_NUM_THREADS=4 TRITON_PRINT_AUTOTUNING=0
source benchmarks/device_env.sh || exit 1
cd benchmarks
timeout 250 python3 attention_decode_tile.py > "$R/attention-tile.txt" 2>&1
tail -22 "$R/attention-tile.txt"
cp ../kernels/fp8_gemm_decode_table.json "$R/table.json"
timeout 300 python3 gemm_parity_tune.py --shapes llama3.1-8b:gate_up qwen2.5-7b:gate_up \
  --ms 1 8 16 32 64 --block-n 32 64 128 --warps 4 8 --stages 3 4 --variants 0x1 1x2 1x4 \
  --table "$R/table.json" --out "$R/gateup" > "$R/gateup.log" 2>&1
tail -30 "$R/gateup.log"
tar czf "${OUT:-/tmp}/h14z.tgz" -C "$R" .
