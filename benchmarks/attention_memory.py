"""Peak device memory and time of one attention forward+backward at trainer lengths.

    python benchmarks/attention_memory.py [--tokens 8192 16384] [--out DIR]

Llama-3.1-8B head shapes (32 query heads, 8 KV heads, head dim 128, BF16), one sequence. Rows:
``masked``: fp8rl's fast path (``kernels.invariant.attention``: GQA-folded queries, an explicit
boolean mask built by ``attention_mask``); ``causal``: SDPA with ``is_causal=True`` and
``enable_gqa=True`` (flash-eligible); ``exact``: the float64 batch-invariant path. Each cell is
the peak above the inputs, in GiB, and the milliseconds of forward+backward.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from fp8rl.kernels.invariant import attention, attention_mask

HEADS, KV_HEADS, DIM = 32, 8, 128


def run(kind: str, tokens: int) -> tuple[float, float]:
    """(peak GiB above the inputs, ms) of forward+backward of ``kind`` at ``tokens``."""
    dev = torch.device("cuda")
    q = torch.randn(1, HEADS, tokens, DIM, device=dev, dtype=torch.bfloat16, requires_grad=True)
    k = torch.randn(1, KV_HEADS, tokens, DIM, device=dev, dtype=torch.bfloat16, requires_grad=True)
    v = torch.randn_like(k, requires_grad=True)
    pos = torch.arange(tokens, device=dev)[None]
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    if kind == "causal":
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    else:
        mask = attention_mask(pos, torch.tensor([tokens], device=dev), tokens)
        out = attention(q, k, v, mask, scale=DIM**-0.5, exact=kind == "exact")
    out.float().sum().backward()
    torch.cuda.synchronize()
    ms = (time.perf_counter() - t0) * 1e3
    return (torch.cuda.max_memory_allocated() - base) / 2**30, ms


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, nargs="+", default=[8192, 16384])
    parser.add_argument("--kinds", nargs="+", default=["masked", "causal", "exact"])
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    rows = []
    for tokens in args.tokens:
        for kind in args.kinds:
            try:
                run(kind, tokens)  # warm-up (kernel choice, allocator)
                gib, ms = run(kind, tokens)
                rows.append(
                    {"tokens": tokens, "kind": kind, "peak_gib": round(gib, 2), "ms": round(ms, 1)}
                )
            except torch.OutOfMemoryError:
                rows.append({"tokens": tokens, "kind": kind, "peak_gib": "OOM", "ms": None})
            torch.cuda.empty_cache()
            print(json.dumps(rows[-1]), flush=True)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "attention-memory.json").write_text(json.dumps(rows, indent=1))
    print("| tokens | kind | peak GiB above inputs | fwd+bwd ms |\n|---|---|---|---|")
    for r in rows:
        print(f"| {r['tokens']} | {r['kind']} | {r['peak_gib']} | {r['ms']} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
