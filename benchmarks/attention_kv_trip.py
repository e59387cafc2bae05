"""Two key blocks per loop trip in the invariant attention forward: same bits, faster? (H200)

    python benchmarks/attention_kv_trip.py

The committed forward (``attention_exact_triton._fwd_kernel``) walks 64-key blocks, one per loop
trip. Over an FP8 cache each trip loads the block's codes, dequantizes them in registers and
stores them to shared memory for the MMA: a chain that holds the FP8 path to ~40-50 % of HBM
bandwidth. ``TRIP`` 2 loads (and dequantizes) two blocks per trip, then runs the two blocks'
online-softmax steps in key order: the same operations in the same order, so the same bits (a
second block wholly past the row's keys is an exact no-op, as the trainer's trailing blocks
are), with twice the bytes in flight per trip. Each variant is checked bitwise against the
committed kernel, then timed on decode calls (Lq = 1). Prints one table.

Result (2026-12-04, ``results/issue14-h200.md``, night section): every variant bitwise; two
blocks per trip slower everywhere; one block per trip on 3 stages 10-16 % faster than the
committed 2 over a BF16 cache, which the kernel now runs for decode-size calls
(``attention_exact_triton.DECODE_STAGES``).
"""

from __future__ import annotations

from functools import partial

import torch
import triton
import triton.language as tl
from decode_attention import graph_time_us  # this folder (run as a script)

from fp8rl.kernels import attention_exact_triton as att
from fp8rl.kernels.kv import kv_quantize

H, HKV, D = 32, 8, 128
HBM = 4.3e12
_LOG2E = 1.4426950408889634


@triton.jit
def _load(base, cols, hi, stride, d, KV_FP8: tl.constexpr, scale, dtype: tl.constexpr):
    x = tl.load(
        base + cols.to(tl.int64)[:, None] * stride + d[None, :],
        mask=(cols < hi)[:, None],
        other=0.0,
    )
    if KV_FP8:
        x = (x.to(tl.float32) * scale).to(dtype)
    return x


@triton.jit
def _step(q, k, v, cols, nvis, m_i, l_i, acc, qk_scale):
    s = tl.dot(q, tl.trans(k)) * qk_scale
    s = tl.where(cols[None, :] < nvis[:, None], s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1))
    alpha = tl.math.exp2(m_i - m_new)
    p = tl.math.exp2(s - m_new[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None]
    acc = tl.dot(p.to(v.dtype), v, acc)
    return m_new, l_i, acc


@triton.jit(do_not_specialize=["Lq", "Lk", "R", "G", "HKV"])
def _fwd(
    Q, K, V, KS, VS, OUT, NVIS, Lq, Lk, R, G, HKV, qk_scale,
    sqb, sqh, sqm, skb, skh, skn, svb, svh, svn, sob, soh, som,
    D: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, KV_FP8: tl.constexpr,
    TRIP: tl.constexpr,
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
    nvis = tl.minimum(tl.load(NVIS + b * Lq + pos, mask=row_ok, other=0), Lk)
    hi = tl.max(nvis, 0)
    k_base = K + b.to(tl.int64) * skb + hk.to(tl.int64) * skh
    v_base = V + b.to(tl.int64) * svb + hk.to(tl.int64) * svh
    k_scale = 1.0
    v_scale = 1.0
    if KV_FP8:
        k_scale = tl.load(KS)
        v_scale = tl.load(VS)
    m_i = tl.full([BM], float("-inf"), tl.float32)
    l_i = tl.zeros([BM], tl.float32)
    acc = tl.zeros([BM, D], tl.float32)
    for start in range(0, hi, BN * TRIP):
        c0 = start + tl.arange(0, BN)
        k0 = _load(k_base, c0, hi, skn, d, KV_FP8, k_scale, q.dtype)
        v0 = _load(v_base, c0, hi, svn, d, KV_FP8, v_scale, q.dtype)
        if TRIP == 2:
            c1 = c0 + BN
            k1 = _load(k_base, c1, hi, skn, d, KV_FP8, k_scale, q.dtype)
            v1 = _load(v_base, c1, hi, svn, d, KV_FP8, v_scale, q.dtype)
        m_i, l_i, acc = _step(q, k0, v0, c0, nvis, m_i, l_i, acc, qk_scale)
        if TRIP == 2:
            m_i, l_i, acc = _step(q, k1, v1, c1, nvis, m_i, l_i, acc, qk_scale)
    out = acc / l_i[:, None]
    o_off = b.to(tl.int64) * sob + head.to(tl.int64) * soh + pos.to(tl.int64) * som
    tl.store(OUT + o_off[:, None] + d[None, :], out.to(OUT.dtype.element_ty), mask=row_ok[:, None])


def run(q, k, v, ks, vs, nvis, trip, stages):
    b, h, lq, d = q.shape
    hkv, lk = k.shape[1], k.shape[2]
    g = h // hkv
    out = torch.empty(b, h, lq, d, dtype=q.dtype, device=q.device)
    fp8 = k.dtype == torch.float8_e4m3fn
    _fwd[(triton.cdiv(g * lq, att.BLOCK_M), b * hkv)](
        q, k, v, ks if fp8 else q, vs if fp8 else q, out, nvis, lq, lk, g * lq, g, hkv,
        d**-0.5 * _LOG2E,
        q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
        v.stride(0), v.stride(1), v.stride(2), out.stride(0), out.stride(1), out.stride(2),
        D=d, BM=att.BLOCK_M, BN=att.BLOCK_N, KV_FP8=fp8, TRIP=trip,
        num_warps=att.NUM_WARPS, num_stages=stages,
    )  # fmt: skip
    return out


def main() -> None:
    torch.manual_seed(0)
    variants = [(t, s) for t in (1, 2) for s in (2, 3)]
    points = [(64, 448), (256, 448), (64, 2176), (64, 4160)]
    lines = ["| cache | batch | keys | committed µs (its stages then) | " + " | ".join(f"trip {t} stages {s}" for t, s in variants) + " |"]  # fmt: skip
    lines.append("|---" * (4 + len(variants)) + "|")
    for batch, keys in points:
        cap = -(-keys // 128) * 128
        q = torch.randn(batch, H, 1, D, device="cuda").bfloat16() * 3
        k = torch.randn(batch, HKV, cap, D, device="cuda").bfloat16()
        v = torch.randn(batch, HKV, cap, D, device="cuda").bfloat16()
        ks, vs = torch.tensor(0.0123, device="cuda"), torch.tensor(0.0087, device="cuda")
        kc, vc = kv_quantize(k, ks), kv_quantize(v, vs)
        for name, kk, vv in (("bf16", k, v), ("fp8", kc, vc)):
            # a ragged batch: each sequence sees its own count of keys
            nvis = torch.randint(keys // 2, keys + 1, (batch, 1), device="cuda", dtype=torch.int32)
            nvis[0] = keys
            read = int(nvis.sum()) * HKV * D * 2 * kk.element_size()
            ref_fn = partial(att.exact_attention, q, kk, vv, nvis, scale=D**-0.5, k_scale=ks, v_scale=vs)  # fmt: skip
            ref = ref_fn()
            t_ref = graph_time_us(ref_fn)
            cells = []
            for trip, stages in variants:
                fn = partial(run, q, kk, vv, ks, vs, nvis, trip, stages)
                try:
                    same = torch.equal(fn(), ref)
                    t = graph_time_us(fn)
                except Exception as exc:  # keep the other cells
                    cells.append(f"error {str(exc)[:40]}")
                    continue
                frac = read / (t * 1e-6) / HBM
                cells.append(f"{t:.1f} ({100 * frac:.0f}%){'' if same else ' DIFFERS'}")
            frac = read / (t_ref * 1e-6) / HBM
            lines.append(f"| {name} | {batch} | {keys} | {t_ref:.1f} ({100 * frac:.0f}%) | {' | '.join(cells)} |")  # fmt: skip
            print(lines[-1], flush=True)
    print("\nµs per decode call (CUDA graph), % of 4.3 TB/s on the cache bytes read")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
