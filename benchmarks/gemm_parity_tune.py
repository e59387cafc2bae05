"""Time the parity-safe decode GEMM configs against today's FP8 path and BF16 (issue 14).

    python benchmarks/gemm_parity_tune.py --table kernels/fp8_gemm_decode_table.json --out DIR

The trainer's FProp (M = thousands of tokens) runs cuBLASLt ``scaled_mm``; a rollout row is
parity-safe only when it is bitwise that row of the trainer's product. ``BLOCK_M`` 64 (wgmma,
one warpgroup per 64 rows) with ``split_k`` 1 accumulates the 128-wide K blocks in the same order
and rounding as cuBLASLt; ``BLOCK_M`` 32 (mma.sync) and split-K do not (measured 2026-12-02).

For every (N, K) of ``gemm_tune.SHAPES`` and M in ``--ms`` (activation already quantized, as the
fused norm/SwiGLU kernels produce it) this times every ``split_k`` 1 candidate (``BLOCK_M`` 64 or
128 × ``BLOCK_N`` × ``num_warps`` × ``num_stages`` × loop variant) and checks its output rows for bitwise equality
with ``scaled_mm`` at M = 4096 on rows that contain the same M rows (offset ``ROW_OFFSET``).
Baselines: ``fp8_gemm`` as dispatched today (decode kernel off: ``scaled_mm`` from M = 16, the
tiled Triton kernel below) and BF16 ``torch.matmul``. Timing as ``gemm_tune``: CUDA-graph
replay over several weight copies (cold in L2), ``do_bench`` median.

``--table`` puts the best bitwise candidate per swept (M bucket, N, K) into the table's
``parity_safe`` list (rows of points not swept are kept) with ``fp8_in`` = whether it beat today's path by ``WIN_MARGIN``, or today's path is not
bitwise the trainer's rows there (parity before speed); the dispatcher runs those rows by
default (``gemm_decode_triton.decode_wins``).
"""

from __future__ import annotations

import argparse
import datetime
import json
from pathlib import Path

import torch
import triton
from gemm_tune import SHAPES, _decode_fns, bench_graph, library_gemm

from fp8rl.kernels import gemm_decode_triton as dec
from fp8rl.kernels import per_block_quant, quant_triton

TRAINER_ROWS = 4096
"""M of the trainer-side ``scaled_mm`` product the candidate rows must match bitwise."""
ROW_OFFSET = 1000
"""First of the trainer rows the decode rows are (not 0: the rows sit mid-batch)."""
WIN_MARGIN = 0.97
"""A candidate wins when its time is below this fraction of today's path (timing noise ~1-2%)."""


def candidates(
    block_ns=(16, 32, 64, 128),
    warps=(4, 8),
    stages=(3, 4, 5, 6),
    variants=((0, 1),),
    block_ms=(64,),
) -> list[dec.DecodeConfig]:
    """``split_k`` 1 over ``BLOCK_M`` × ``BLOCK_N`` × warps × stages × loop variant (the
    ``keeps_k_order`` shape). A variant is (scale_ahead, k_trip) (``DecodeConfig``)."""
    return [
        dec.DecodeConfig(bm, bn, 1, w, st, ahead, trip)
        for bm in block_ms
        for bn in block_ns
        for w in warps
        for st in stages
        for ahead, trip in variants
    ]


def today(xq, wq):
    """The fast path before this sweep: ``scaled_mm`` from M = 16, the tiled Triton kernel below."""
    return library_gemm(xq, wq)


def sweep_shape(n: int, k: int, ms: list[int], rep: int, configs) -> list[dict]:
    """Per M: today's path, BF16, and every candidate (time, bitwise vs the trainer's rows)."""
    copies = min(8, max(2, triton.cdiv(3 * 60 * 2**20, n * k)))
    weights = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02 for _ in range(copies)]
    quantized = [per_block_quant(w) for w in weights]
    x_big = torch.randn(TRAINER_ROWS, k, device="cuda", dtype=torch.bfloat16)
    trainer = today(quant_triton.per_token_group_quant_triton(x_big), quantized[0])
    rows = []
    for m in ms:
        x = x_big[ROW_OFFSET : ROW_OFFSET + m].contiguous()
        xq = quant_triton.per_token_group_quant_triton(x)
        ref = trainer[ROW_OFFSET : ROW_OFFSET + m]
        bf16 = bench_graph([lambda w=w, x=x: torch.matmul(x, w.t()) for w in weights[:4]], rep)
        base = bench_graph([lambda q=q, xq=xq: today(xq, q) for q in quantized], rep)
        base_bitwise = torch.equal(today(xq, quantized[0]), ref)
        tuned = dec._table().get((dec.m_bucket(m), n, k))  # the split-K table (set_enabled)
        tuned_us = None
        if tuned is not None:
            tuned_us = bench_graph(_decode_fns(xq, quantized, tuned[0]), rep) * 1e3
        timed = []
        limit = dec._shared_memory_limit(x.device)
        fitted = {dec.fit_stages(cfg, 1, limit): None for cfg in configs}  # what would run
        for cfg in fitted:
            try:
                out = dec.fp8_gemm_decode(xq, quantized[0], out_dtype=torch.bfloat16, config=cfg)[0]
            except Exception as err:  # a tile the compiler refuses (e.g. BLOCK_N 16, 8 warps)
                print(f"  skip {cfg}: {type(err).__name__}: {str(err)[:80]}", flush=True)
                continue
            differ = int((out != ref).sum())
            us = bench_graph(_decode_fns(xq, quantized, cfg), rep) * 1e3
            timed.append({"config": cfg, "us": us, "differ": differ})
        safe = [t for t in timed if t["differ"] == 0]
        best = min(safe, key=lambda t: t["us"]) if safe else None
        fastest = min(timed, key=lambda t: t["us"])
        row = {
            "m": m, "n": n, "k": k, "bf16_us": bf16 * 1e3, "today_us": base * 1e3,
            "today_bitwise": base_bitwise, "tuned_us": tuned_us, "num_candidates": len(timed), "num_bitwise": len(safe),
            "fastest_us": fastest["us"], "fastest_differ": fastest["differ"],
            "safe_us": best["us"] if best else None,
            "safe_config": dec.config_row(
                m, n, k, best["config"], prologue=False,
                fp8_in=best["us"] < WIN_MARGIN * base * 1e3 or not base_bitwise,
            ) if best else None,
            "all": [{**t, "config": list(vars(t["config"]).values())} for t in timed],
        }  # fmt: skip
        rows.append(row)
        safe_txt = f"{best['us']:7.1f} us {best['config']}" if best else "none bitwise"
        print(
            f"  N={n:6d} K={k:6d} M={m:4d} bf16 {row['bf16_us']:7.1f} today {row['today_us']:7.1f}"
            f" (bitwise {base_bitwise}) safe {safe_txt} [{len(safe)}/{len(timed)} bitwise]",
            flush=True,
        )
    return rows


def write_table(path: Path, rows: list[dict], stamp: str) -> None:
    """Replace the table's ``parity_safe`` rows of the swept (M bucket, N, K) with this sweep's
    best bitwise rows (a swept point without one loses its row); other points keep theirs."""
    keys = [(dec.m_bucket(r["m"]), r["n"], r["k"]) for r in rows]
    swept = set(keys)
    if len(swept) < len(keys):  # one row per bucket: a bucket's row must hold for all of its M
        raise ValueError("--ms with two values in one M bucket (the next power of two)")
    table = json.loads(path.read_text())
    kept = [r for r in table.get("parity_safe", []) if (r["m"], r["n"], r["k"]) not in swept]
    new = [{**r["safe_config"], "parity_safe": True} for r in rows if r["safe_config"]]
    table["parity_safe"] = sorted(kept + new, key=lambda r: (r["n"], r["k"], r["m"]))
    table["parity_safe_tuned"] = f"{stamp} (benchmarks/gemm_parity_tune.py)"
    path.write_text(json.dumps(table, indent=1) + "\n")


def render(rows: list[dict], stamp: str, env: str) -> str:
    """The markdown table: per (shape, M) the best bitwise config against today and BF16."""
    lines = [
        f"# Parity-safe decode GEMM (split_k 1) — {stamp} · {env}",
        "",
        "FP8 activation already quantized. `today` = `fp8_gemm` with the decode kernel off",
        "(`scaled_mm` for M ≥ 16, tiled Triton below); `safe` = fastest candidate whose rows are",
        f"bitwise the trainer's `scaled_mm` rows at M = {TRAINER_ROWS}. CUDA graphs, cold weights.",
        "",
        "| model | layer | M | BF16 µs | today µs | today bitwise | safe µs | config (BM/BN/split/warps/stages/ahead x trip)"
        " | safe/BF16 | today/BF16 | safe vs today | bitwise/tried | fastest µs (differ) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        c = r["safe_config"]
        cfg = (
            f"{c['block_m']}/{c['block_n']}/{c['split_k']}/{c['num_warps']}/{c['num_stages']}"
            f"/{c.get('scale_ahead', 0)}x{c.get('k_trip', 1)}"
            if c
            else "—"
        )
        safe = r["safe_us"]
        lines.append(
            f"| {r['model']} | {r['layer']} | {r['m']} | {r['bf16_us']:.1f} | {r['today_us']:.1f}"
            f" | {'yes' if r['today_bitwise'] else 'no'} | {safe:.1f} | {cfg}"
            f" | {r['bf16_us'] / safe:.2f}× | {r['bf16_us'] / r['today_us']:.2f}×"
            f" | {r['today_us'] / safe:.2f}× | {r['num_bitwise']}/{r['num_candidates']}"
            f" | {r['fastest_us']:.1f} ({r['fastest_differ']}) |"
            if safe
            else f"| {r['model']} | {r['layer']} | {r['m']} | {r['bf16_us']:.1f} |"
            f" {r['today_us']:.1f} | — | — | — | — | — | — | 0/{r['num_candidates']} | — |"
        )
    lines += ["", "| M | mean safe/BF16 | mean today/BF16 | mean dispatched/BF16 | min dispatched/BF16 |",
              "|---|---|---|---|---|"]  # fmt: skip
    for m in sorted({r["m"] for r in rows}):
        at = [r for r in rows if r["m"] == m and r["safe_us"]]
        if not at:
            continue
        disp = [r["bf16_us"] / min(r["safe_us"], r["today_us"]) if r["safe_config"]["fp8_in"]
                else r["bf16_us"] / r["today_us"] for r in at]  # fmt: skip
        lines.append(
            f"| {m} | {sum(r['bf16_us'] / r['safe_us'] for r in at) / len(at):.2f}×"
            f" | {sum(r['bf16_us'] / r['today_us'] for r in at) / len(at):.2f}×"
            f" | {sum(disp) / len(disp):.2f}× | {min(disp):.2f}× |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ms", type=int, nargs="+", default=[1, 8, 16, 32, 64, 128, 256])
    parser.add_argument("--rep", type=int, default=6, help="do_bench milliseconds per timing")
    parser.add_argument("--table", type=Path, help="add the parity_safe rows to this table")
    parser.add_argument("--out", type=Path, help="folder for gemm-parity.json / gemm-parity.md")
    parser.add_argument("--block-m", type=int, nargs="+", default=[64], help="64 and/or 128")
    parser.add_argument("--block-n", type=int, nargs="+", default=[16, 32, 64, 128])
    parser.add_argument("--warps", type=int, nargs="+", default=[4, 8])
    parser.add_argument("--stages", type=int, nargs="+", default=[3, 4, 5, 6])
    parser.add_argument(
        "--variants", nargs="+", default=["0x1", "1x2", "1x4"],
        help="loop variants AxT: scales loaded A (0/1) trips early, T (1/2/4) K blocks per trip",
    )  # fmt: skip
    parser.add_argument("--shapes", nargs="+", help="model:layer to sweep (default: all)")
    args = parser.parse_args()
    if args.table and len({dec.m_bucket(m) for m in args.ms}) < len(args.ms):
        parser.error("--ms with --table: one value per M bucket (the next power of two)")
    variants = [tuple(int(x) for x in v.split("x")) for v in args.variants]
    configs = candidates(args.block_n, args.warps, args.stages, variants, args.block_m)
    previous = dec.set_enabled(False)
    rows = []
    for model, layers in SHAPES.items():
        for name, (n, k) in layers.items():
            if args.shapes and f"{model}:{name}" not in args.shapes:
                continue
            rows += [
                {"model": model, "layer": name, **r}
                for r in sweep_shape(n, k, args.ms, args.rep, configs)
            ]
    dec.set_enabled(previous)
    stamp = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    env = (
        f"{torch.cuda.get_device_name()} · torch {torch.__version__} · triton {triton.__version__}"
    )
    if args.table:
        write_table(args.table, rows, f"{stamp} · {env}")
    text = render(rows, stamp, env)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "gemm-parity.json").write_text(json.dumps(rows, indent=1, default=str))
        (args.out / "gemm-parity.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
