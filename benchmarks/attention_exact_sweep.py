"""Tile sweep of the exact-mode Triton attention at the trainer's shape (issue 14), vs SDPA.

    python benchmarks/attention_exact_sweep.py

Llama-3.1-8B heads (32 query, 8 KV, D=128), 4 causal sequences of 4096. Times the forward
(ms) and forward+backward for a few forward tiles (the invariant config is one of them) and
backward tiles (free to tune), patching the module constants; prints a table.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
import triton

from fp8rl.kernels import attention_exact_triton as mod

B, H, HKV, L, D = 4, 32, 8, 4096, 128


def bench(fn) -> float:
    return triton.testing.do_bench(fn, warmup=5, rep=30)


def main() -> None:
    q = torch.randn(B, H, L, D, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    k = torch.randn(B, HKV, L, D, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    v = torch.randn(B, HKV, L, D, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    g = torch.randn(B, H, L, D, device="cuda", dtype=torch.bfloat16)
    nvis = torch.arange(1, L + 1, device="cuda").expand(B, L)

    def ours():
        return mod.exact_attention(q, k, v, nvis, scale=D**-0.5)

    def sdpa():
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)

    rows = []
    for name, fn in (("sdpa", sdpa),):
        fwd = bench(lambda fn=fn: fn())
        both = bench(lambda fn=fn: fn().backward(g))
        rows.append((name, fwd, both - fwd))
    fwd_cfgs = [(64, 64, 4, 2), (128, 64, 8, 2), (128, 128, 8, 2), (64, 128, 4, 2)]
    for bm, bn, w, st in fwd_cfgs:
        mod.BLOCK_M, mod.BLOCK_N, mod.NUM_WARPS, mod.NUM_STAGES = bm, bn, w, st
        with torch.no_grad():
            fwd = bench(ours)
        rows.append((f"fwd {bm}x{bn} w{w} s{st}", fwd, float("nan")))
    mod.BLOCK_M, mod.BLOCK_N, mod.NUM_WARPS, mod.NUM_STAGES = 64, 64, 4, 2
    for bm, bn, w in [(64, 64, 8), (64, 64, 4), (32, 64, 4), (128, 64, 8)]:
        mod.BWD_BLOCK_M, mod.BWD_BLOCK_N, mod.BWD_WARPS = bm, bn, w
        try:
            both = bench(lambda: ours().backward(g))
        except Exception as exc:  # e.g. out of shared memory
            print(f"bwd {bm}x{bn} w{w}: {type(exc).__name__}")
            continue
        rows.append((f"bwd {bm}x{bn} w{w}", float("nan"), both))
    print("| kernel | fwd ms | bwd (fwd+bwd for ours' bwd rows) ms |\n|---|---|---|")
    for name, f, b in rows:
        print(f"| {name} | {f:.2f} | {b:.2f} |")


if __name__ == "__main__":
    main()
