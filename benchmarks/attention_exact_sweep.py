"""Tile sweep of the exact-mode Triton attention at the trainer's shape (issue 14), vs SDPA.

    python benchmarks/attention_exact_sweep.py

Llama-3.1-8B heads (32 query, 8 KV, D=128), 4 causal sequences of 4096. Times the forward
(ms) for a few forward tiles (the invariant config is one of them; the forward's tiles are fixed
by the engine/trainer parity, so these rows are for reference) and the backward (forward+backward
minus forward, ms) for candidate tiles of its two kernels (``DQ_TILES``, ``DKDV_TILES``: free to
tune), patching the module constants; prints a table.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
import triton

from fp8rl.kernels import attention_exact_triton as mod

B, H, HKV, L, D = 4, 32, 8, 4096, 128
DEFAULT = ((64, 64, 8, 2), (64, 64, 8, 2))
"""(dQ tiles, dK/dV tiles) of the backward before the sweep: (query rows, keys, warps, stages)."""
DQ_CANDIDATES = [
    (64, 64, 4, 2), (64, 64, 4, 3), (64, 64, 8, 3), (128, 64, 8, 2), (128, 64, 8, 3),
    (128, 128, 8, 2), (64, 128, 4, 3), (128, 32, 4, 3), (128, 64, 4, 3),
]  # fmt: skip
DKDV_CANDIDATES = [
    (64, 64, 4, 2), (64, 64, 4, 3), (64, 128, 8, 2), (64, 128, 8, 3), (128, 128, 8, 2),
    (32, 128, 4, 3), (128, 64, 8, 2), (64, 128, 4, 3), (32, 64, 4, 3), (64, 64, 8, 3),
    (32, 128, 8, 3), (128, 64, 4, 3),
]  # fmt: skip


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
    with torch.no_grad():
        fwd = bench(ours)
    reference = None

    def backward(dq, dkdv) -> float:
        """Backward ms of one tile pair (nan if it does not compile); rows get its gradient gap."""
        nonlocal reference
        mod.DQ_TILES, mod.DKDV_TILES = dq, dkdv
        name = f"bwd dq {'x'.join(map(str, dq))} dkdv {'x'.join(map(str, dkdv))}"
        try:
            grads = torch.autograd.grad(ours(), (q, k, v), g)
            both = bench(lambda: ours().backward(g))
        except Exception as exc:  # e.g. out of shared memory
            rows.append((f"{name}: {type(exc).__name__}", fwd, float("nan")))
            return float("inf")
        reference = reference or grads  # the default's gradients: the others must stay close
        diff = max(
            float((a.float() - r.float()).abs().max() / r.float().abs().max())
            for a, r in zip(grads, reference, strict=True)
        )
        rows.append((f"{name} (max rel Δ vs default {diff:.1e})", fwd, both - fwd))
        return both - fwd

    backward(*DEFAULT)  # dQ tiles first (dK/dV at the default), then dK/dV at the best dQ
    best_dq = min(DQ_CANDIDATES, key=lambda dq: backward(dq, DEFAULT[1]))
    best_dkdv = min(DKDV_CANDIDATES, key=lambda t: backward(best_dq, t))
    mod.DQ_TILES, mod.DKDV_TILES = DEFAULT
    print("| kernel | fwd ms | bwd ms |\n|---|---|---|")
    for name, f, b in rows:
        print(f"| {name} | {f:.2f} | {b:.2f} |")
    print(f"best: DQ_TILES = {best_dq}, DKDV_TILES = {best_dkdv}")


if __name__ == "__main__":
    main()
