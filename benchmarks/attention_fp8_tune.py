"""Sweep of the invariant attention forward over an FP8 KV cache read in place (H200).

    python benchmarks/attention_fp8_tune.py

The committed kernel (``attention_exact_triton._fwd_kernel`` with ``KV_FP8``) dequantizes each
tile in registers as ``(code · scale)`` rounded to BF16 and stores it to shared memory for the
BF16 wgmma; it moves ~40-50 % of HBM on FP8 bytes where the BF16 cache reaches 63-95 %. Compiled
for sm_90 with Triton 3.6 (the device's; ``triton.compile`` runs on a CPU), its 3-stage binary
holds 168 registers and 80 KB of shared memory a program: two programs (8 warps) per SM, each
running load → dequantize → store → MMA → softmax → MMA in series. The variants here change when
things are computed, never what, so each must stay bitwise the trainer's path (the BF16 kernel
over ``kv_round_trip`` keys), which is checked before it is timed:

* ``late_v``: V is dequantized after the Q·Kᵀ product instead of before it, so the BF16 K tile's
  shared memory is free again when V's is written (Triton 3.6 at 3 stages: 64 KB, 189 registers);
* ``maxnreg``: a register cap (ptxas); with ``late_v`` at 3 stages, 168 registers and 64 KB give
  three programs per SM instead of two (no spills at 168 in the CPU compile; 128 spills);
* ``num_stages`` 2-4 (pipelining: the next tiles' copies are issued at the end of a trip, so 3
  stages keep one tile in flight during the compute and 4 keep two).

Prints one table (µs per call from a CUDA graph, % of 4.3 TB/s for the FP8 bytes read, the
binary's registers / spills / shared memory). Every variant is the committed kernel
(``attention_exact_triton._fwd_kernel``: ``LATE_V`` is its ``FP8_KV_LATE_V`` switch) at another
launch; the winner becomes ``FP8_KV_LATE_V`` / ``FP8_KV_STAGES`` / ``FP8_KV_MAXNREG`` there.
Earlier variants, measured slower on 2026-12-04 and dropped here (code at ``a1bb9ab``): a manual
prefetch of the next tile, and a power-of-two scale folded into the scores
(``results/issue14/attention-graphs-1204e/call3-fp8-tune.md``).
"""

from __future__ import annotations

import argparse
from functools import partial

import torch
import triton
from decode_attention import graph_time_us  # this folder (run as a script)

from fp8rl.kernels import attention_exact_triton as att
from fp8rl.kernels.kv import kv_quantize, kv_round_trip

H, HKV, D = 32, 8, 128
HBM = {"H200": 4.3e12, "H100": 3.35e12}
"""Bytes/s: the H200's measured copy rate (the brief), the H100 SXM's data-sheet HBM3 rate."""


def run(q, kc, vc, ks, vs, nvis, late_v, stages, maxnreg, binaries):
    b, h, lq, d = q.shape
    hkv, lk = kc.shape[1], kc.shape[2]
    g = h // hkv
    out = torch.empty_like(q)
    lse = torch.empty(b, h, lq, dtype=torch.float32, device=q.device)
    cap = {} if maxnreg is None else {"maxnreg": maxnreg}
    binaries.append(att._fwd_kernel[(triton.cdiv(g * lq, att.BLOCK_M), b * hkv)](
        q, kc, vc, ks, vs, out, lse, nvis, lq, lk, g * lq, g, hkv, d**-0.5 * 1.4426950408889634,
        q.stride(0), q.stride(1), q.stride(2), kc.stride(0), kc.stride(1), kc.stride(2),
        vc.stride(0), vc.stride(1), vc.stride(2), out.stride(0), out.stride(1), out.stride(2),
        D=d, BM=att.BLOCK_M, BN=att.BLOCK_N, KV_FP8=True, LATE_V=late_v,
        num_warps=att.NUM_WARPS, num_stages=stages, **cap,
    ))  # fmt: skip
    return out


def _resources(binary) -> str:
    """Registers / spilled registers / shared memory (KB) of a compiled kernel, or '?'."""
    try:
        return f"{binary.n_regs} / {binary.n_spills} / {binary.metadata.shared // 1024}"
    except AttributeError:
        return "?"


VARIANTS = [  # (late_v, num_stages, maxnreg)
    (False, 3, None), (False, 4, None), (True, 3, None), (True, 4, None),
    (True, 3, 168), (True, 3, 160), (True, 4, 168), (True, 2, 128),
]  # fmt: skip
"""8 warps over the same tiles (with and without a 128-register cap) were bitwise but 1.5-2x
slower on the H100 (2026-12-05, code at ``03423be``)."""


def committed(q, kc, vc, ks, vs, nvis):
    return att.exact_attention(q, kc, vc, nvis, scale=D**-0.5, k_scale=ks, v_scale=vs)


SHAPES = [(64, 448), (64, 2176), (64, 4160), (256, 448), (256, 2176)]  # (batch, keys)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--shapes",
        nargs="+",
        default=[f"{b}x{k}" for b, k in SHAPES],
        help="batch x keys, e.g. 64x4160",
    )
    parser.add_argument(
        "--variants", nargs="+", type=int, help="indices into VARIANTS (default: all)"
    )
    args = parser.parse_args()
    shapes = [tuple(map(int, s.split("x"))) for s in args.shapes]
    variants = VARIANTS if args.variants is None else [VARIANTS[i] for i in args.variants]
    torch.manual_seed(0)
    gpu = torch.cuda.get_device_name()
    hbm = next((rate for key, rate in HBM.items() if key in gpu), HBM["H200"])
    print(f"{gpu}: % HBM of {hbm / 1e12:.2f} TB/s")
    lines = ["| batch | keys | variant | µs | % HBM (FP8 bytes) | regs / spills / smem KB | bitwise vs trainer |",
             "|---|---|---|---|---|---|---|"]  # fmt: skip
    for batch, keys in shapes:
        cap = -(-keys // 128) * 128
        q = torch.randn(batch, H, 1, D, device="cuda").bfloat16()
        k = torch.randn(batch, HKV, cap, D, device="cuda").bfloat16()
        v = torch.randn(batch, HKV, cap, D, device="cuda").bfloat16()
        nvis = torch.full((batch, 1), keys, device="cuda", dtype=torch.int32)
        read = batch * HKV * keys * D * 2
        ks, vs = torch.tensor(0.0123, device="cuda"), torch.tensor(0.0087, device="cuda")
        kc, vc = kv_quantize(k, ks), kv_quantize(v, vs)
        # the trainer's path: the committed BF16 kernel over the round-tripped keys
        ref = att.exact_attention(q, kv_round_trip(k, ks, q.dtype), kv_round_trip(v, vs, q.dtype), nvis, scale=D**-0.5)  # fmt: skip
        cases = [("committed", None)] + [
            (f"late_v={lv} stages={st} maxnreg={mr}", (lv, st, mr)) for lv, st, mr in variants
        ]
        for name, cfg in cases:
            args, binaries = (q, kc, vc, ks, vs, nvis), []
            fn = partial(committed, *args) if cfg is None else partial(run, *args, *cfg, binaries)
            try:
                same = torch.equal(fn(), ref)
                t = graph_time_us(fn)
            except Exception as exc:  # keep the other rows
                lines.append(f"| {batch} | {keys} | {name} | error | {str(exc)[:80]} | | |")
                continue
            res = _resources(binaries[0]) if binaries else "committed binary"
            lines.append(f"| {batch} | {keys} | {name} | {t:.1f} | {100 * read / (t * 1e-6) / hbm:.0f}% | {res} | {same} |")  # fmt: skip
            print(lines[-1], flush=True)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
