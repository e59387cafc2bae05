"""Tune the decode-size FP8 GEMM (M ≤ 256) and compare FP8 linears with BF16 (issue 14).

    python benchmarks/gemm_tune.py --table kernels/fp8_gemm_decode_table.json --out results/

For every (N, K) of the Llama-3.1-8B and Qwen2.5-7B linears and M in ``--ms``, times the decode
kernel over a grid of configs (BLOCK_N × SPLIT_K, BLOCK_M = the M bucket clamped to 16..64) on an
already-quantized activation, then the best config with the 1×128 quantization in its prologue
(BF16 input), against BF16 ``torch.matmul``, the previous fast path (Triton 1×128 quant +
``scaled_mm``) and ``scaled_mm`` alone. The table records the config and, per shape, whether
each decode variant beat its library counterpart (``prologue``, ``fp8_in``).
Timing: CUDA-graph replay of 4-8 closures with their own weights (weights never hot in L2),
``triton.testing.do_bench`` median. Writes the best config per (M bucket, N, K) as the table the
dispatcher reads, and prints a table of speedups.
"""

from __future__ import annotations

import argparse
import datetime
import itertools
import json
from pathlib import Path

import torch
import triton
from triton.testing import do_bench

from fp8rl.kernels import gemm as gemm_module
from fp8rl.kernels import gemm_decode_triton as dec
from fp8rl.kernels import gemm_triton, per_block_quant, quant_triton

SHAPES = {  # (N, K) of the [N, K] weights (q/k/v and gate/up fused, as the engine runs them)
    "llama3.1-8b": {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (28672, 4096),
                    "down": (4096, 14336)},
    "qwen2.5-7b": {"qkv": (4608, 3584), "o": (3584, 3584), "gate_up": (37888, 3584),
                   "down": (3584, 18944)},
}  # fmt: skip


def bench_graph(fns: list, rep: int) -> float:
    """Median ms per call of ``fns`` replayed round-robin from one CUDA graph."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for fn in fns:
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for fn in fns:
            fn()
    return float(do_bench(graph.replay, warmup=5, rep=rep, return_mode="median")) / len(fns)


def candidates(m: int) -> list[dec.DecodeConfig]:
    block_m = dec.block_m_for(m)
    grid = itertools.product((32, 64, 128), (1, 2, 4, 8))
    return [dec.DecodeConfig(block_m, bn, split) for bn, split in grid if bn * split <= 512]


def library_fprop(x, wq):
    """The previous fast path: Triton 1×128 quant, then scaled_mm (cuBLASLt blockwise)."""
    xq = quant_triton.per_token_group_quant_triton(x)
    out = gemm_module._library_gemm("scaled_mm", xq, wq, torch.bfloat16)
    if out is None:
        out = gemm_triton.fp8_gemm_triton(xq, wq, out_dtype=torch.bfloat16)
    return out


def library_gemm(xq, wq):
    """The previous fast path's GEMM alone (activation already quantized)."""
    out = gemm_module._library_gemm("scaled_mm", xq, wq, torch.bfloat16)
    if out is None:
        out = gemm_triton.fp8_gemm_triton(xq, wq, out_dtype=torch.bfloat16)
    return out


def _decode_fns(a, quantized, cfg) -> list:
    return [
        lambda q=q: dec.fp8_gemm_decode(a, q, out_dtype=torch.bfloat16, config=cfg)
        for q in quantized
    ]


def tune_shape(n: int, k: int, ms: list[int], rep: int) -> list[dict]:
    """Per M: the best config on a quantized activation (the fused decoder's case), then that
    config with the quantization in the prologue (``fp8_linear`` on a BF16 activation)."""
    copies = min(8, max(2, triton.cdiv(3 * 60 * 2**20, n * k)))
    weights = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02 for _ in range(copies)]
    quantized = [per_block_quant(w) for w in weights]
    rows = []
    for m in ms:
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        xq = quant_triton.per_token_group_quant_triton(x)
        bf16 = bench_graph([lambda w=w, x=x: torch.matmul(x, w.t()) for w in weights[:4]], rep)
        library = bench_graph([lambda q=q, x=x: library_fprop(x, q) for q in quantized], rep)
        lib_gemm = bench_graph([lambda q=q, xq=xq: library_gemm(xq, q) for q in quantized], rep)
        timed = [(bench_graph(_decode_fns(xq, quantized, c), rep), c) for c in candidates(m)]
        fp8_in, cfg = min(timed, key=lambda t: t[0])
        prologue = bench_graph(_decode_fns(x, quantized, cfg), rep)
        fp8_bytes = n * k + m * k * 2 + m * n * 2
        best = min(prologue, library)
        row = {"m": m, "n": n, "k": k, "bf16_us": bf16 * 1e3, "library_us": library * 1e3,
               "decode_us": prologue * 1e3, "decode_fp8_in_us": fp8_in * 1e3,
               "library_gemm_us": lib_gemm * 1e3,
               "config": dec.config_row(m, n, k, cfg, prologue=prologue < library,
                                        fp8_in=fp8_in < lib_gemm),
               "speedup": bf16 / best, "library_speedup": bf16 / library,
               "decode_tbps": fp8_bytes / prologue / 1e9}  # fmt: skip
        rows.append(row)
        print(f"  N={n:6d} K={k:6d} M={m:4d} bf16 {row['bf16_us']:7.1f} us  previous "
              f"{row['library_us']:7.1f}  prologue {row['decode_us']:7.1f}  FP8 in: decode "
              f"{row['decode_fp8_in_us']:7.1f} scaled_mm {row['library_gemm_us']:7.1f} us {cfg}",
              flush=True)  # fmt: skip
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ms", type=int, nargs="+", default=[1, 16, 64, 128, 256])
    parser.add_argument("--rep", type=int, default=8, help="do_bench milliseconds per timing")
    parser.add_argument("--table", type=Path, help="write the tuned config table here")
    parser.add_argument("--out", type=Path, help="folder for gemm-tune.json / gemm-tune.md")
    args = parser.parse_args()
    rows = []
    for model, layers in SHAPES.items():
        for name, (n, k) in layers.items():
            for row in tune_shape(n, k, args.ms, args.rep):
                rows.append({"model": model, "layer": name, **row})
    stamp = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    env = (
        f"{torch.cuda.get_device_name()} · torch {torch.__version__} · triton {triton.__version__}"
    )
    if args.table:
        configs = {(r["config"]["m"], r["n"], r["k"]): r["config"] for r in rows}
        args.table.write_text(
            json.dumps({"tuned": f"{stamp} · {env}", "configs": list(configs.values())}, indent=1)
        )
    small = [r for r in rows if r["m"] <= 256]
    mean = sum(r["speedup"] for r in small) / len(small)
    lines = [
        f"# FP8 linear at decode sizes vs BF16 — {stamp} · {env}",
        "",
        "FP8 = the faster of the decode GEMM with the 1×128 quant in its prologue and the previous",
        "path (Triton quant + `scaled_mm`), i.e. what `fp8_linear` dispatches to; BF16 =",
        "`torch.matmul`. Last two columns: activation already quantized (the fused decoder).",
        "CUDA-graph replay, cold weights.",
        "",
        "| model | layer | M | BF16 µs | previous µs | prologue µs | FP8/BF16 | previous/BF16 | TB/s |"
        " decode, FP8 input µs | scaled_mm, FP8 input µs |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
        *(
            f"| {r['model']} | {r['layer']} | {r['m']} | {r['bf16_us']:.1f} | {r['library_us']:.1f}"
            f" | {r['decode_us']:.1f} | {r['speedup']:.2f}× | {r['library_speedup']:.2f}× |"
            f" {r['decode_tbps']:.2f} | {r['decode_fp8_in_us']:.1f} | {r['library_gemm_us']:.1f} |"
            for r in rows
        ),
        "",
        f"Mean FP8/BF16 over M ≤ 256: {mean:.2f}× (min {min(r['speedup'] for r in small):.2f}×).",
    ]
    table = "\n".join(lines) + "\n"
    print(table)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "gemm-tune.json").write_text(json.dumps(rows, indent=1))
        (args.out / "gemm-tune.md").write_text(table)


if __name__ == "__main__":
    main()
