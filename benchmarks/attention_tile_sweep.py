"""Sweep of the invariant attention forward's tiles, trainer and decode together (H200).

    python benchmarks/attention_tile_sweep.py [--quick]

``attention_exact_triton._fwd_kernel`` is one arithmetic for the trainer's rows and the engine's
prefill and decode rows: ``BLOCK_N`` (the online softmax's key block) and ``num_warps`` (the
reduction tree of a row's max and sum) are part of it, so they can only change for every caller
at once. ``BLOCK_M`` with one warpgroup per 64 rows and ``num_stages`` are not meant to be.
This script times each (``BLOCK_N``, warps) arithmetic on the calls that matter, with the
trainer's row tile at 64 rows / 4 warps and 128 rows / 8 warps, and checks, per arithmetic:

* ``dec=train``: BF16 decode rows (Lq = 1, the GQA group folded in a 64-row tile) are bitwise the
  trainer's rows of a causal forward over the same sequence (its last position);
* ``fp8=rt``: decode rows over an FP8 cache read in place are bitwise the decode rows over the
  trainer's ``kv_round_trip`` keys;
* ``m128=m64``: the trainer's 128-row / 8-warp tile gives the 64-row / 4-warp rows.

Prints one table: µs per call (CUDA graph replay) per case, and the checks.
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
LOG2E = 1.4426950408889634


def fwd(q, k, v, nvis, bm, bn, warps, stages, ks=None, vs=None):
    """The committed forward kernel at the given tiles; returns (out, lse)."""
    b, h, lq, d = q.shape
    hkv, lk = k.shape[1], k.shape[2]
    g = h // hkv
    fp8 = k.dtype == torch.float8_e4m3fn
    out = torch.empty(b, h, lq, d, dtype=q.dtype, device=q.device)
    lse = torch.empty(b, h, lq, dtype=torch.float32, device=q.device)
    att._fwd_kernel[(triton.cdiv(g * lq, bm), b * hkv)](
        q, k, v, ks if fp8 else q, vs if fp8 else q, out, lse, nvis, lq, lk, g * lq, g, hkv,
        d**-0.5 * LOG2E,
        q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
        v.stride(0), v.stride(1), v.stride(2), out.stride(0), out.stride(1), out.stride(2),
        D=d, BM=bm, BN=bn, KV_FP8=fp8, LATE_V=False, num_warps=warps, num_stages=stages,
    )  # fmt: skip
    return out, lse


def timed(fn) -> str:
    try:
        return f"{graph_time_us(fn):.1f}"
    except Exception as exc:  # keep the other rows (e.g. shared memory overflow)
        return f"err:{type(exc).__name__}"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="fewer stages")
    args = parser.parse_args()
    torch.manual_seed(0)
    dev = "cuda"
    # trainer: 4 × 4,096 causal (the 16K-token micro-batch)
    tb, tl_ = 4, 4096
    tq = torch.randn(tb, H, tl_, D, device=dev).bfloat16()
    tk = torch.randn(tb, HKV, tl_, D, device=dev).bfloat16()
    tv = torch.randn(tb, HKV, tl_, D, device=dev).bfloat16()
    tn = (torch.arange(tl_, device=dev, dtype=torch.int32) + 1).expand(tb, tl_).contiguous()
    # decode calls: (batch, keys), BF16 and FP8 caches
    decode = {}
    for batch, keys in [(64, 448), (256, 448), (64, 2176), (64, 4160)]:
        cap = -(-keys // 128) * 128
        q = torch.randn(batch, H, 1, D, device=dev).bfloat16()
        k = torch.randn(batch, HKV, cap, D, device=dev).bfloat16()
        v = torch.randn(batch, HKV, cap, D, device=dev).bfloat16()
        ks, vs = torch.tensor(0.0123, device=dev), torch.tensor(0.0087, device=dev)
        kc, vc = kv_quantize(k, ks), kv_quantize(v, vs)
        krt, vrt = kv_round_trip(k, ks, q.dtype), kv_round_trip(v, vs, q.dtype)
        nv = torch.full((batch, 1), keys, device=dev, dtype=torch.int32)
        decode[(batch, keys)] = (q, k, v, kc, vc, ks, vs, krt, vrt, nv)
    # parity sequence: a 1,000-token causal forward and the decode row at its last position
    pl = 1000
    pq = torch.randn(2, H, pl, D, device=dev).bfloat16()
    pk = torch.randn(2, HKV, pl, D, device=dev).bfloat16()
    pv = torch.randn(2, HKV, pl, D, device=dev).bfloat16()
    pn = (torch.arange(pl, device=dev, dtype=torch.int32) + 1).expand(2, pl).contiguous()
    pks, pvs = torch.tensor(0.0123, device=dev), torch.tensor(0.0087, device=dev)
    pkc, pvc = kv_quantize(pk, pks), kv_quantize(pv, pvs)
    pkrt, pvrt = kv_round_trip(pk, pks, pq.dtype), kv_round_trip(pv, pvs, pq.dtype)
    last = torch.full((2, 1), pl, device=dev, dtype=torch.int32)

    stages_list = (2, 3) if args.quick else (2, 3, 4)
    head = (
        "| BN | warps | stages | train m64 | train m128/8w | "
        + " | ".join(f"bf16 {b}×{k}" for b, k in decode)
        + " | "
        + " | ".join(f"fp8 {b}×{k}" for b, k in decode)
        + " | dec=train | fp8=rt | m128=m64 |"
    )
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for bn in (64, 128):
        for warps in (4, 8):
            # parity checks for this arithmetic (stages 2)
            try:
                full, _ = fwd(pq, pk, pv, pn, 64, bn, warps, 2)
                full128, _ = fwd(pq, pk, pv, pn, 128, bn, 2 * warps, 2)
                dec, _ = fwd(pq[:, :, -1:].contiguous(), pk, pv, last, 64, bn, warps, 2)
                fullrt, _ = fwd(pq, pkrt, pvrt, pn, 64, bn, warps, 2)
                decf, _ = fwd(
                    pq[:, :, -1:].contiguous(), pkc, pvc, last, 64, bn, warps, 3, pks, pvs
                )
                checks = (
                    torch.equal(dec, full[:, :, -1:]),
                    torch.equal(decf, fullrt[:, :, -1:]),
                    torch.equal(full128, full),
                )
            except Exception as exc:
                checks = (f"err:{type(exc).__name__}",) * 3
            for stages in stages_list:
                row = [str(bn), str(warps), str(stages)]
                tiles = (bn, warps, stages)
                row.append(timed(partial(fwd, tq, tk, tv, tn, 64, *tiles)))
                row.append(timed(partial(fwd, tq, tk, tv, tn, 128, bn, 2 * warps, stages)))
                for q, k, v, *_, nv in decode.values():
                    row.append(timed(partial(fwd, q, k, v, nv, 64, *tiles)))
                for q, _, _, kc, vc, ks, vs, _, _, nv in decode.values():
                    row.append(timed(partial(fwd, q, kc, vc, nv, 64, *tiles, ks, vs)))
                row += [str(c) for c in checks]
                lines.append("| " + " | ".join(row) + " |")
                print(lines[-1], flush=True)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
