"""Time ``fp8_linear`` with the 1×128 quant in the parity-safe GEMM's prologue (issue 14).

    python benchmarks/prologue_tune.py --table kernels/fp8_gemm_decode_table.json --out DIR

``fp8_linear`` on a BF16 activation at decode sizes quantizes (one Triton kernel), then runs
``fp8_gemm``. For every ``parity_safe`` row of the table with M bucket ≤ ``--max-m`` this times
that path against the row's config with the quantization in its prologue, and checks the
prologue's output rows bitwise against the trainer's ``scaled_mm`` rows at M = 4096 at both ends
of the bucket. ``--table`` sets the row's ``prologue`` flag: bitwise at both ends and faster by
``WIN_MARGIN``. Timing as ``gemm_tune``: CUDA-graph replay over several weight copies.

Measured 2026-12-04 on the H200 (``results/issue14/graph-draw-1204/call1-overhead-prologue``):
bitwise everywhere, but 6-40× slower than quantize + GEMM on all 40 rows with M ≤ 64 (e.g. the
Llama o projection at M = 1: 371 µs against 17 µs). The 64-row parity-safe tile repeats the
quantization of its rows for every N tile and K block, so no row got the flag.
"""

from __future__ import annotations

import argparse
import datetime
import json
from pathlib import Path

import torch
import triton
from gemm_parity_tune import ROW_OFFSET, TRAINER_ROWS, WIN_MARGIN, today
from gemm_tune import bench_graph

from fp8rl.kernels import gemm_decode_triton as dec
from fp8rl.kernels import per_block_quant, quant_triton
from fp8rl.kernels.gemm import fp8_gemm


def measure(row: dict, rep: int) -> dict:
    """One parity-safe row: BF16, quantize + ``fp8_gemm``, prologue; bitwise at both ends."""
    m, n, k, cfg = row["m"], row["n"], row["k"], dec._config(row)
    copies = min(8, max(2, triton.cdiv(3 * 60 * 2**20, n * k)))
    weights = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02 for _ in range(copies)]
    quantized = [per_block_quant(w) for w in weights]
    x_big = torch.randn(TRAINER_ROWS, k, device="cuda", dtype=torch.bfloat16)
    trainer = today(quant_triton.per_token_group_quant_triton(x_big), quantized[0])
    differ = 0
    for rows in sorted({m, m // 2 + 1}):
        x = x_big[ROW_OFFSET : ROW_OFFSET + rows].contiguous()
        out = dec.fp8_gemm_decode(x, quantized[0], out_dtype=torch.bfloat16, config=cfg)[0]
        differ += int((out != trainer[ROW_OFFSET : ROW_OFFSET + rows]).sum())
    x = x_big[ROW_OFFSET : ROW_OFFSET + m].contiguous()

    def split(q):
        return fp8_gemm(quant_triton.per_token_group_quant_triton(x), q, out_dtype=torch.bfloat16)

    bf16 = bench_graph([lambda w=w: torch.matmul(x, w.t()) for w in weights[:4]], rep)
    quant_gemm = bench_graph([lambda q=q: split(q) for q in quantized], rep)
    prologue = bench_graph(
        [
            lambda q=q: dec.fp8_gemm_decode(x, q, out_dtype=torch.bfloat16, config=cfg)
            for q in quantized
        ],
        rep,
    )
    wins = differ == 0 and prologue < WIN_MARGIN * quant_gemm
    print(
        f"  N={n:6d} K={k:6d} M={m:4d} bf16 {bf16 * 1e3:6.1f} quant+gemm {quant_gemm * 1e3:6.1f} "
        f"prologue {prologue * 1e3:6.1f} us differ {differ} -> {'prologue' if wins else 'split'}",
        flush=True,
    )
    return {"m": m, "n": n, "k": k, "bf16_us": bf16 * 1e3, "quant_gemm_us": quant_gemm * 1e3,
            "prologue_us": prologue * 1e3, "differ": differ, "prologue": wins}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--table", type=Path, default=dec.TABLE_PATH)
    parser.add_argument("--write", action="store_true", help="set the rows' prologue flags")
    parser.add_argument("--max-m", type=int, default=64)
    parser.add_argument("--rep", type=int, default=6, help="do_bench milliseconds per timing")
    parser.add_argument("--out", type=Path, help="folder for prologue-tune.json / .md")
    args = parser.parse_args()
    stamp = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    table = json.loads(args.table.read_text())
    todo = [r for r in table["parity_safe"] if r["m"] <= args.max_m]
    results = [measure(r, args.rep) for r in todo]
    lines = [
        f"# fp8_linear at decode sizes: quantize + GEMM vs prologue quant — {stamp}",
        "",
        "| M | N | K | BF16 µs | quant + GEMM µs | prologue µs | differ | linear/BF16 before | after |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        after = min(r["quant_gemm_us"], r["prologue_us"]) if r["prologue"] else r["quant_gemm_us"]
        lines.append(
            f"| {r['m']} | {r['n']} | {r['k']} | {r['bf16_us']:.1f} | {r['quant_gemm_us']:.1f} | "
            f"{r['prologue_us']:.1f} | {r['differ']} | {r['bf16_us'] / r['quant_gemm_us']:.2f}× | "
            f"{r['bf16_us'] / after:.2f}× |"
        )
    print("\n".join(lines))
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "prologue-tune.json").write_text(json.dumps(results, indent=1) + "\n")
        (args.out / "prologue-tune.md").write_text("\n".join(lines) + "\n")
    if args.write:
        flags = {(r["m"], r["n"], r["k"]): r["prologue"] for r in results}
        for row in table["parity_safe"]:
            key = (row["m"], row["n"], row["k"])
            if key in flags:
                row["prologue"] = flags[key]
        table["parity_safe_prologue_tuned"] = f"{stamp} (benchmarks/prologue_tune.py)"
        args.table.write_text(json.dumps(table, indent=1) + "\n")


if __name__ == "__main__":
    main()
