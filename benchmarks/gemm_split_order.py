"""Ordered K splits for the FProp GEMM: decode-size speed and the trainer's cost (issue 14).

    python benchmarks/gemm_split_order.py --out DIR [--splits 2 4 8] [--ms 1 16 32 64 128 256]

A rollout row is parity-safe when it is bitwise the trainer's row. With one program per output
tile walking all of K (``split_k`` 1) the decode kernel is bitwise cuBLASLt ``scaled_mm`` but
cannot keep HBM busy on long-K / small-N shapes. An *ordered* K split changes the contract
instead of the kernel: the K blocks are cut into ``S`` consecutive runs, each run is the same
K-ordered chain from zero, and the runs' sums are added in order. The split-K decode kernel
(``BLOCK_M`` 64) computes exactly that; the trainer would compute it with one cuBLASLt
``scaled_mm`` per run and an ordered float32 sum (``scaled_mm_ordered`` below).

For every (N, K) of ``gemm_tune.SHAPES`` and split ``S`` this measures:

* decode sizes (M in ``--ms``, activation already quantized): the best ``BLOCK_M`` 64 / split
  ``S`` config, whether its rows are bitwise the trainer's ordered rows at M = 4096, against
  today's default dispatch (``fp8_gemm``) and BF16 ``torch.matmul``;
* trainer sizes (M = 4096, 16384): ``scaled_mm`` over all of K (today), ``scaled_mm_ordered``
  and BF16 (what the ordered contract would cost the trainer's FProp).

Measured 2026-12-03 (``benchmarks/results/issue14/split-order-1203/``): bitwise everywhere, but
only a win at M ≤ 64 on o/down, a loss at M ≥ 128 and +40 % on the trainer's down FProp: not
adopted.

CUDA-graph replay over several weight copies (cold in L2), ``do_bench`` median, as ``gemm_tune``.
Writes ``split-order.json`` (every timing) and ``split-order.md`` (the summary table).
"""

from __future__ import annotations

import argparse
import datetime
import json
from pathlib import Path

import torch
import triton
from gemm_tune import SHAPES, _decode_fns, bench_graph

from fp8rl.kernels import QuantizedTensor, fp8_gemm, per_block_quant, quant_triton
from fp8rl.kernels import gemm_decode_triton as dec
from fp8rl.kernels.gemm import _recipe, scaled_mm_scales
from fp8rl.kernels.quant import GROUP

TRAINER_ROWS = 4096
ROW_OFFSET = 1000


def decode_candidates(split: int) -> list[dec.DecodeConfig]:
    """``BLOCK_M`` 64 (wgmma) configs with ``split`` ordered K runs."""
    return [dec.DecodeConfig(64, bn, split, 4, stages) for bn in (32, 64, 128) for stages in (3, 5)]


def split_ranges(k_blocks: int, k_splits: int) -> list[tuple[int, int]]:
    """The ordered runs ``[(first block, end block), ...]``: ``ceil(k_blocks / k_splits)``
    blocks each (the split-K decode kernel's cut)."""
    per = -(-k_blocks // k_splits)
    return [(s * per, min(k_blocks, (s + 1) * per)) for s in range(k_splits) if s * per < k_blocks]


def scaled_mm_ordered(a: QuantizedTensor, b: QuantizedTensor, k_splits: int) -> torch.Tensor:
    """The trainer side of an ordered split on cuBLASLt: one ``scaled_mm`` per run of K blocks
    (strided K-slice views, float32 out), the runs added in order, rounded once to BF16."""
    scale_a = scaled_mm_scales(a)
    total = None
    for k0, k1 in split_ranges(scale_a.shape[1], k_splits):
        cols = slice(k0 * GROUP, k1 * GROUP)
        b_run = QuantizedTensor(b.codes[:, cols], b.scale[:, k0:k1].contiguous(), b.block)
        part = torch.nn.functional.scaled_mm(
            a.codes[:, cols], b_run.codes.t(), scale_a[:, k0:k1], _recipe(a.block),
            scaled_mm_scales(b_run), _recipe(b.block), output_dtype=torch.float32,
        )  # fmt: skip
        total = part if total is None else total.add_(part)
    return total.to(torch.bfloat16)


def sweep_shape(n: int, k: int, ms: list[int], splits: list[int], rep: int) -> dict:
    copies = min(8, max(2, triton.cdiv(3 * 60 * 2**20, n * k)))
    weights = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02 for _ in range(copies)]
    quantized = [per_block_quant(w) for w in weights]
    x_big = torch.randn(16384, k, device="cuda", dtype=torch.bfloat16)
    xq_big = quant_triton.per_token_group_quant_triton(x_big)
    xq_4k = quant_triton.per_token_group_quant_triton(x_big[:TRAINER_ROWS].contiguous())
    result = {"n": n, "k": k, "decode": [], "trainer": []}
    # trainer sizes: today, and each ordered split on both paths
    for m, xq in ((TRAINER_ROWS, xq_4k), (16384, xq_big)):
        xb = x_big[:m]
        row = {"m": m}
        row["bf16_us"] = (
            bench_graph([lambda w=w, xb=xb: torch.matmul(xb, w.t()) for w in weights[:2]], rep)
            * 1e3
        )
        row["today_us"] = bench_graph([lambda q=q, xq=xq: fp8_gemm(xq, q, out_dtype=torch.bfloat16) for q in quantized[:2]], rep) * 1e3  # fmt: skip
        for split in splits:
            row[f"s{split}_us"] = bench_graph([lambda q=q, s=split, xq=xq: scaled_mm_ordered(xq, q, s) for q in quantized[:2]], rep) * 1e3  # fmt: skip
        result["trainer"].append(row)
        print(f"  N={n} K={k} M={m}: " + " ".join(f"{key}={val:.1f}" if isinstance(val, float) else f"{key}={val}" for key, val in row.items()), flush=True)  # fmt: skip
    references = {1: fp8_gemm(xq_4k, quantized[0], out_dtype=torch.bfloat16)}
    references.update({s: scaled_mm_ordered(xq_4k, quantized[0], s) for s in splits})
    for m in ms:
        x = x_big[ROW_OFFSET : ROW_OFFSET + m].contiguous()
        xq = quant_triton.per_token_group_quant_triton(x)
        row = {"m": m}
        row["bf16_us"] = (
            bench_graph([lambda w=w, x=x: torch.matmul(x, w.t()) for w in weights[:4]], rep) * 1e3
        )
        row["today_us"] = bench_graph([lambda q=q, xq=xq: fp8_gemm(xq, q, out_dtype=torch.bfloat16) for q in quantized], rep) * 1e3  # fmt: skip
        row["today_bitwise"] = torch.equal(fp8_gemm(xq, quantized[0], out_dtype=torch.bfloat16), references[1][ROW_OFFSET : ROW_OFFSET + m])  # fmt: skip
        for split in splits:
            ref = references[split][ROW_OFFSET : ROW_OFFSET + m]
            timed = []
            for cfg in decode_candidates(split):
                try:
                    out = dec.fp8_gemm_decode(
                        xq, quantized[0], out_dtype=torch.bfloat16, config=cfg
                    )[0]
                except Exception as err:
                    print(f"  skip {cfg}: {type(err).__name__}: {str(err)[:80]}", flush=True)
                    continue
                us = bench_graph(_decode_fns(xq, quantized, cfg), rep) * 1e3
                timed.append({"config": [cfg.block_m, cfg.block_n, cfg.split_k, cfg.num_warps, cfg.num_stages], "us": us, "differ": int((out != ref).sum())})  # fmt: skip
            safe = [t for t in timed if t["differ"] == 0]
            row[f"s{split}"] = min(safe, key=lambda t: t["us"]) if safe else None
            row[f"s{split}_bitwise"] = f"{len(safe)}/{len(timed)}"
        result["decode"].append(row)
        best = " ".join(
            f"S{s}={row[f's{s}']['us']:.1f}({row[f's{s}_bitwise']})"
            if row[f"s{s}"]
            else f"S{s}=none"
            for s in splits
        )
        print(f"  N={n} K={k} M={m}: bf16 {row['bf16_us']:.1f} today {row['today_us']:.1f} (bitwise {row['today_bitwise']}) {best}", flush=True)  # fmt: skip
    return result


def render(results: list[dict], splits: list[int], stamp: str) -> str:
    lines = [
        f"# Ordered K splits — {stamp}",
        "",
        "## Decode sizes (µs; best bitwise BLOCK_M 64 config per split)",
        "",
    ]
    head = "| shape | M | BF16 | today | " + " | ".join(f"S={s}" for s in splits) + " |"
    lines += [head, "|" + "---|" * (4 + len(splits))]
    for r in results:
        for d in r["decode"]:
            cells = [f"{d[f's{s}']['us']:.1f}" if d[f"s{s}"] else "—" for s in splits]
            lines.append(f"| {r['model']} {r['layer']} | {d['m']} | {d['bf16_us']:.1f} | {d['today_us']:.1f} | " + " | ".join(cells) + " |")  # fmt: skip
    lines += ["", "## Trainer sizes (µs; S = one scaled_mm per run + the ordered sum)", ""]
    lines += ["| shape | M | BF16 | today | " + " | ".join(f"S={s}" for s in splits) + " |"]
    lines += ["|" + "---|" * (4 + len(splits))]
    for r in results:
        for t in r["trainer"]:
            cells = [f"{t[f's{s}_us']:.1f}" for s in splits]
            lines.append(f"| {r['model']} {r['layer']} | {t['m']} | {t['bf16_us']:.1f} | {t['today_us']:.1f} | " + " | ".join(cells) + " |")  # fmt: skip
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ms", type=int, nargs="+", default=[1, 16, 32, 64, 128, 256])
    parser.add_argument("--splits", type=int, nargs="+", default=[2, 4, 8])
    parser.add_argument("--models", nargs="+", default=list(SHAPES))
    parser.add_argument("--layers", nargs="+", default=["qkv", "o", "gate_up", "down"])
    parser.add_argument("--rep", type=int, default=5)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    dec.set_enabled(False)
    results = []
    for model in args.models:
        for layer in args.layers:
            n, k = SHAPES[model][layer]
            print(f"== {model} {layer} N={n} K={k}", flush=True)
            results.append(
                {
                    "model": model,
                    "layer": layer,
                    **sweep_shape(n, k, args.ms, args.splits, args.rep),
                }
            )
            args.out.mkdir(parents=True, exist_ok=True)
            (args.out / "split-order.json").write_text(json.dumps(results, indent=1))
    stamp = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    stamp += f" · {torch.cuda.get_device_name()} · torch {torch.__version__} · triton {triton.__version__}"
    text = render(results, args.splits, stamp)
    (args.out / "split-order.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
