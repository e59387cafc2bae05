"""Micro-benchmark of the split-KV decode attention against the previous fast path.

    python benchmarks/decode_attention.py [--out DIR]

Llama-3.1-8B attention shapes (32 query heads, 8 KV heads, head dim 128), one query per
sequence, every sequence at ``length`` valid keys in a cache of ``capacity`` = the engine's
128-position bucket. Each variant is captured in a CUDA graph of ``REPS`` calls and replayed
(no launch overhead). Achieved bandwidth = bytes of the K/V actually read (valid keys only) /
time, against the 4.3 TB/s measured HBM copy bandwidth. "SDPA" is the fast path before
2026-12-04: dequantize the whole cache (FP8), build the mask, SDPA over the capacity;
"invariant" is the default since then: the invariant Triton flash attention of exact mode,
reading the cache in place (``invariant.set_fast_attention``).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
import triton

from fp8rl.kernels import decode_attention as da
from fp8rl.kernels.invariant import attention, attention_mask, set_fast_attention
from fp8rl.kernels.kv import kv_dequantize, kv_quantize

HBM_BYTES_PER_S = 4.3e12
REPS = 20
H, HKV, D = 32, 8, 128


def graph_time_us(fn) -> float:
    """Mean microseconds per call of ``fn`` replayed from a CUDA graph of REPS calls."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(REPS):
            fn()
    graph.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(5):
        start.record()
        graph.replay()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / REPS)
    return min(times)


def case(batch: int, length: int, kv: str, splits_sweep: bool) -> list[dict]:
    capacity = -(-length // 128) * 128
    q = torch.randn(batch, H, 1, D, device="cuda").bfloat16()
    k = torch.randn(batch, HKV, capacity, D, device="cuda").bfloat16()
    v = torch.randn(batch, HKV, capacity, D, device="cuda").bfloat16()
    scales = {}
    if kv == "fp8":
        scales = {"k_scale": torch.tensor(0.01, device="cuda"), "v_scale": torch.tensor(0.01, device="cuda")}  # fmt: skip
        k, v = kv_quantize(k, scales["k_scale"]), kv_quantize(v, scales["v_scale"])
    k_len = torch.full((batch,), length, device="cuda")
    pos = (k_len - 1)[:, None]
    scale = D**-0.5

    def before():
        kk, vv = k, v
        if scales:
            kk = kv_dequantize(k, scales["k_scale"], q.dtype)
            vv = kv_dequantize(v, scales["v_scale"], q.dtype)
        mask = attention_mask(pos, k_len, capacity)
        return attention(q, kk, vv, mask, scale=scale, exact=False)

    previous = set_fast_attention("sdpa")
    try:
        t_before = graph_time_us(before)
    finally:
        set_fast_attention(previous)
    t_inv = graph_time_us(
        lambda: attention(q, k, v, None, scale=scale, q_pos=pos, k_len=k_len, **scales)
    )
    default = da.num_splits(batch, HKV, capacity)
    sweep = [
        (s, da.BLOCK_N) for s in sorted({default, 1, 2, 4, 8, 16} if splits_sweep else {default})
    ]
    if kv == "fp8":  # half-byte tiles: does a 128-key tile put enough bytes in flight?
        sweep.append((default, 128))
    read = batch * HKV * length * D * 2 * (1 if kv == "fp8" else 2)
    rows = []
    for splits, block_n in sweep:
        t = graph_time_us(
            lambda s=splits, n=block_n: da.decode_attention(
                q, k, v, pos, k_len, scale=scale, splits=s, block_n=n, **scales
            )
        )
        rows.append(
            {
                "batch": batch,
                "length": length,
                "capacity": capacity,
                "kv": kv,
                "splits": splits,
                "block_n": block_n,
                "default": splits == default and block_n == da.BLOCK_N,
                "us": t,
                "gb_s": read / t / 1e3,
                "pct_hbm": 100 * read / (t * 1e-6) / HBM_BYTES_PER_S,
                "before_us": t_before,
                "invariant_us": t_inv,
                "invariant_pct_hbm": 100 * read / (t_inv * 1e-6) / HBM_BYTES_PER_S,
                "speedup": t_before / t,
            }
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path)
    parser.add_argument("--no-sweep", action="store_true", help="default split count only")
    args = parser.parse_args()
    rows = []
    for batch, length in [(64, 448), (256, 448), (64, 2176), (64, 4160), (8, 4160)]:
        for kv in ("bf16", "fp8"):
            rows += case(batch, length, kv, splits_sweep=batch == 64 and not args.no_sweep)
            print(json.dumps(rows[-1]), flush=True)
    table = (
        f"# Decode attention micro-benchmark (H={H}, Hkv={HKV}, D={D}; {torch.cuda.get_device_name()}, "
        f"torch {torch.__version__}, triton {triton.__version__})\n\n"
        "| batch | valid keys | capacity | KV | splits | keys/tile | µs | GB/s | % of 4.3 TB/s | SDPA µs | speed-up | invariant µs | invariant % of 4.3 TB/s |\n"
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|\n"
        + "\n".join(
            f"| {r['batch']} | {r['length']} | {r['capacity']} | {r['kv']} | "
            f"{r['splits']}{' (default)' if r['default'] else ''} | {r['block_n']} | {r['us']:.1f} | {r['gb_s']:,.0f} | "
            f"{r['pct_hbm']:.0f}% | {r['before_us']:.1f} | {r['speedup']:.2f}× | "
            f"{r['invariant_us']:.1f} | {r['invariant_pct_hbm']:.0f}% |"
            for r in rows
        )
        + "\n"
    )
    print(table)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "decode-attention-micro.md").write_text(table)
        (args.out / "decode-attention-micro.json").write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
