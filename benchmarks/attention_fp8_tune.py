"""Sweep of the invariant attention forward over an FP8 KV cache read in place (H200).

    python benchmarks/attention_fp8_tune.py

The committed kernel (``attention_exact_triton._fwd_kernel`` with ``KV_FP8``) dequantizes each
tile in registers as ``(code · scale)`` rounded to BF16 and moves 2.0 TB/s of FP8 bytes at most.
Variants, each checked bitwise against the trainer's path (the BF16 kernel over
``kv_round_trip`` keys) before it is timed:

* ``pow2``: with a power-of-two scale, ``code · scale`` is exact in BF16, so the tile is
  converted without a multiply and the scales move to the fp32 scores (folded into the softmax
  scale) and the output (``acc · v_scale``): the same bits, fewer instructions per element;
* ``prefetch``: the next tile's codes are loaded before the current one is used;
* ``num_stages`` 2–4 (pipelining only; the arithmetic is the committed one).

Prints one table (µs per call from a CUDA graph, % of 4.3 TB/s for the FP8 bytes read).
``_fwd`` is a copy of the committed forward with the variant switches (an experiment: the
committed kernel took the winning ``num_stages``, ``attention_exact_triton.FP8_KV_STAGES``).
Results of 2026-12-04: ``results/issue14/attention-graphs-1204e/call3-fp8-tune.md``.
"""

from __future__ import annotations

from functools import partial

import torch
import triton
import triton.language as tl
from decode_attention import graph_time_us  # this folder (run as a script)

from fp8rl.kernels import attention_exact_triton as att
from fp8rl.kernels.kv import kv_quantize, kv_round_trip

H, HKV, D = 32, 8, 128
HBM = 4.3e12


@triton.jit
def _fwd(
    Q, K, V, KS, VS, OUT, NVIS, Lq, Lk, R, G, HKV, qk_scale,
    sqb, sqh, sqm, skb, skh, skn, svb, svh, svn, sob, soh, som,
    D: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, POW2: tl.constexpr,
    PREFETCH: tl.constexpr,
):  # fmt: skip
    pid_m = tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = pid_bh // HKV
    hk = pid_bh % HKV
    rows = pid_m * BM + tl.arange(0, BM)
    row_ok = rows < R
    head = hk * G + rows // Lq
    pos = rows % Lq
    d = tl.arange(0, D)
    q_off = b.to(tl.int64) * sqb + head.to(tl.int64) * sqh + pos.to(tl.int64) * sqm
    q = tl.load(Q + q_off[:, None] + d[None, :], mask=row_ok[:, None], other=0.0)
    nvis = tl.load(NVIS + b * Lq + pos, mask=row_ok, other=0)
    hi = tl.minimum(tl.max(nvis, 0), Lk)
    k_base = K + b.to(tl.int64) * skb + hk.to(tl.int64) * skh
    v_base = V + b.to(tl.int64) * svb + hk.to(tl.int64) * svh
    k_scale = tl.load(KS)
    v_scale = tl.load(VS)
    s_scale = qk_scale
    if POW2:
        s_scale = qk_scale * k_scale
    m_i = tl.full([BM], float("-inf"), tl.float32)
    l_i = tl.zeros([BM], tl.float32)
    acc = tl.zeros([BM, D], tl.float32)
    c0 = tl.arange(0, BN)
    k_nx = tl.load(
        k_base + c0.to(tl.int64)[:, None] * skn + d[None, :], mask=(c0 < hi)[:, None], other=0.0
    )
    v_nx = tl.load(
        v_base + c0.to(tl.int64)[:, None] * svn + d[None, :], mask=(c0 < hi)[:, None], other=0.0
    )
    for start in range(0, hi, BN):
        cols = start + tl.arange(0, BN)
        col_ok = cols < hi
        if PREFETCH:
            k = k_nx
            v = v_nx
            nc = cols + BN
            k_nx = tl.load(
                k_base + nc.to(tl.int64)[:, None] * skn + d[None, :],
                mask=(nc < hi)[:, None],
                other=0.0,
            )
            v_nx = tl.load(
                v_base + nc.to(tl.int64)[:, None] * svn + d[None, :],
                mask=(nc < hi)[:, None],
                other=0.0,
            )
        else:
            k = tl.load(
                k_base + cols.to(tl.int64)[:, None] * skn + d[None, :],
                mask=col_ok[:, None],
                other=0.0,
            )
            v = tl.load(
                v_base + cols.to(tl.int64)[:, None] * svn + d[None, :],
                mask=col_ok[:, None],
                other=0.0,
            )
        if POW2:
            k = k.to(q.dtype)
            v = v.to(q.dtype)
        else:
            k = (k.to(tl.float32) * k_scale).to(q.dtype)
            v = (v.to(tl.float32) * v_scale).to(q.dtype)
        s = tl.dot(q, tl.trans(k)) * s_scale
        s = tl.where(cols[None, :] < nvis[:, None], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.math.exp2(m_i - m_new)
        p = tl.math.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None]
        acc = tl.dot(p.to(v.dtype), v, acc)
        m_i = m_new
    if POW2:
        acc = acc * v_scale
    out = acc / l_i[:, None]
    o_off = b.to(tl.int64) * sob + head.to(tl.int64) * soh + pos.to(tl.int64) * som
    tl.store(OUT + o_off[:, None] + d[None, :], out.to(OUT.dtype.element_ty), mask=row_ok[:, None])


def run(q, kc, vc, ks, vs, nvis, pow2, prefetch, stages):
    b, h, lq, d = q.shape
    hkv, lk = kc.shape[1], kc.shape[2]
    g = h // hkv
    out = torch.empty_like(q)
    _fwd[(triton.cdiv(g * lq, att.BLOCK_M), b * hkv)](
        q, kc, vc, ks, vs, out, nvis, lq, lk, g * lq, g, hkv, d**-0.5 * 1.4426950408889634,
        q.stride(0), q.stride(1), q.stride(2), kc.stride(0), kc.stride(1), kc.stride(2),
        vc.stride(0), vc.stride(1), vc.stride(2), out.stride(0), out.stride(1), out.stride(2),
        D=d, BM=att.BLOCK_M, BN=att.BLOCK_N, POW2=pow2, PREFETCH=prefetch,
        num_warps=att.NUM_WARPS, num_stages=stages,
    )  # fmt: skip
    return out


def committed(q, kc, vc, ks, vs, nvis):
    return att.exact_attention(q, kc, vc, nvis, scale=D**-0.5, k_scale=ks, v_scale=vs)


def main() -> None:
    torch.manual_seed(0)
    lines = ["| batch | keys | variant | µs | % HBM (FP8 bytes) | bitwise vs trainer |",
             "|---|---|---|---|---|---|"]  # fmt: skip
    for batch, keys in [(64, 448), (64, 2176), (64, 4160), (256, 448), (256, 2176)]:
        cap = -(-keys // 128) * 128
        q = torch.randn(batch, H, 1, D, device="cuda").bfloat16()
        k = torch.randn(batch, HKV, cap, D, device="cuda").bfloat16()
        v = torch.randn(batch, HKV, cap, D, device="cuda").bfloat16()
        nvis = torch.full((batch, 1), keys, device="cuda", dtype=torch.int32)
        read = batch * HKV * keys * D * 2
        for pow2 in (False, True):
            ks = torch.tensor(2.0**-7 if pow2 else 0.0123, device="cuda")
            vs = torch.tensor(2.0**-6 if pow2 else 0.0087, device="cuda")
            kc, vc = kv_quantize(k, ks), kv_quantize(v, vs)
            # the trainer's path: the committed BF16 kernel over the round-tripped keys
            ref = att.exact_attention(q, kv_round_trip(k, ks, q.dtype), kv_round_trip(v, vs, q.dtype), nvis, scale=D**-0.5)  # fmt: skip
            cases = [("committed", None)] if not pow2 else []
            cases += [(f"{'pow2' if pow2 else 'mul'} prefetch={p} stages={s}", (p, s))
                      for p in (False, True) for s in (2, 3, 4)]  # fmt: skip
            for name, cfg in cases:
                args = (q, kc, vc, ks, vs, nvis)
                fn = partial(committed, *args) if cfg is None else partial(run, *args, pow2, *cfg)
                try:
                    same = torch.equal(fn(), ref)
                    t = graph_time_us(fn)
                except Exception as exc:  # keep the other rows
                    lines.append(f"| {batch} | {keys} | {name} | error | {str(exc)[:80]} | |")
                    continue
                lines.append(f"| {batch} | {keys} | {name} | {t:.1f} | {100 * read / (t * 1e-6) / HBM:.0f}% | {same} |")  # fmt: skip
                print(lines[-1], flush=True)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
