"""Batch-invariant flash attention on CUDA (Triton), forward and backward: exact mode's, and
since 2026-12-04 the fast mode's too (``invariant.set_fast_attention``).

The forward is the one kernel both sides of the bitwise contract run: the trainer over whole
sequences and the rollout engine for prefill and every KV-cache decode step. In fast mode it
replaced SDPA: engine and trainer attention then agree bitwise there as well, and the engine
reads its KV cache in place (H200, Llama-3.1-8B decode at gen 512: +23-25 % tok/s unified FP8,
+12-18 % BF16; the 8-layer train step at 16K tokens as fast as SDPA, 4 GB less peak memory). A query row's
output bits depend only on that row's query, the keys/values it can see and the head size:

* **One arithmetic.** ``BLOCK_M``, ``BLOCK_N`` and ``num_warps`` are constants of this module,
  never chosen from the shape; the integer sizes are excluded from Triton's specialisation
  (``do_not_specialize``). Only ``num_stages`` (software pipelining: when a tile is loaded, not
  what is computed from it) differs: 3 for decode-size calls (``DECODE_STAGES``) and an FP8
  cache (``FP8_KV_STAGES``), 2 for the trainer's; the GPU tests check those rows bitwise.
* **An FP8 KV cache read in place** (``KV_FP8``, the engine only): each tile is dequantized in
  registers as ``(code · scale)`` in float32 rounded to the query dtype, bitwise
  ``kv.kv_dequantize`` and the trainer's ``kv_round_trip``, then the same arithmetic follows.
  The tile has to pass through registers into shared memory for the BF16 ``tl.dot``, which
  holds this path to ~40-53 % of HBM bandwidth on FP8 bytes (the BF16 path: 63-89 %); V is
  dequantized after Q·Kᵀ under a register cap (``FP8_KV_LATE_V``, ``FP8_KV_MAXNREG``).
* **Decode tiles** (opt-in: ``decode_tiles``, fast mode's ``set_fast_attention("triton_decode16")``).
  A decode call (Lq = 1) over a BF16 K/V with at most ``DECODE_BLOCK_M`` query heads per KV head
  may run 16-row tiles (mma.sync) instead of 64-row ones (wgmma), with the same ``BLOCK_N``, key
  order and arithmetic: a 64-row tile of a decode step is 60 rows of padding. Against the 64-row
  tile on 2 stages the call is 10-20 % faster (H200, batch 64 / 256 at 448 keys: 32 / 112 µs
  against 40 / 136; decode calls now run 3 stages, 30 / 98 µs in another run), and a 32-layer
  decode at batch 256 7-9 % faster. On random N(0, 1) inputs every decode row was bitwise the
  trainer's 64-row-tile row, but not on model activations: exact-mode engine vs trainer max
  |Δlogp| 0.004 (tiny-llama) and 0.03 / 0.11 (small-llama; BF16 / unified FP8 mode, BF16 cache)
  with them on (2026-12-04). The two MMA instructions need not round a sum alike. So the
  invariant default keeps 64-row tiles, exact mode never runs 16-row ones, and an FP8 cache keeps
  64 (with 16 it was no faster). Pairing mma.sync tiles on both sides (trainer 32 rows / 4 warps,
  decode 16 / 2) keeps BF16 rows bitwise on heavy-tailed inputs but is no faster there (192 µs
  either way, 64 × 2,176 keys), doubles the trainer forward (3.2 against 1.6 ms at 4 × 4,096),
  and over an FP8 cache, where it is 6-11 % faster, its rows are not the round-tripped BF16 rows
  even with the same tiles on both sides (``benchmarks/attention_mma_v2.py``, H100, 2026-12-05).
* **Fixed key order.** Each query row walks key blocks of ``BLOCK_N`` from key 0 upwards: key
  ``j`` always sits at column ``j % BLOCK_N`` of block ``j // BLOCK_N``, and each score is one
  ``tl.dot`` over the head dim with the same instruction sequence whatever the other rows of the
  tile are (a row of an MMA tile does not read other rows).
* **fp32 online softmax; masked keys are exact no-ops.** A query row sees keys
  ``[0, n_visible)`` (a prefix: ``j <= position`` and ``j < k_len``). Key 0 is always visible, so
  after the first block the running max ``m`` is finite; a later block with no visible key for
  the row has scores ``-inf``: ``m_new = m``, ``alpha = exp2(0) = 1``, ``p = exp2(-inf) = 0``,
  so ``l·1 + 0 = l`` and ``acc·1 + 0·V = acc`` bitwise. Visible keys past ``Lk`` never exist,
  masked loads are zeros. Hence a row's bits do not depend on the batch, on Lq (how many rows
  are computed together), on its neighbours in the tile (decode folds a KV head's query group
  into one tile, the trainer a run of positions), on how many trailing key blocks the tile's
  longest row makes it walk, or on the KV cache capacity.

Rows are addressed as the GQA-folded axis ``r = g·Lq + l`` of a KV head (query head
``hk·G + g``, position index ``l``), so K/V are read once per KV head, never repeated.

The backward (trainer only) is FlashAttention-2's (Dao 2023), as in Triton's fused-attention
tutorial: ``dQ`` per query block walking key blocks, ``dK``/``dV`` per key block walking every
query row of its KV head (the GQA group summed inside the program). No atomics, no split
reductions: deterministic, but it need not equal anything bitwise. Tested against float64
attention (``tests/fp8_kernels/test_exact_triton_gpu.py``). Where cuDNN's fused SDPA backward
can take the call (whole causal sequences; padding rows without a gradient), the trainer's
backward runs it from this forward's output and log-sum-exp instead (``attention_cudnn_bwd``).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor
from torch.autograd.function import once_differentiable

from fp8rl.kernels import attention_cudnn_bwd as fused_bwd

BLOCK_M = 64
BLOCK_N = 64
NUM_WARPS = 4
NUM_STAGES = 2
FP8_KV_STAGES = 3
"""Pipeline stages of the forward over an FP8 cache read in place (the engine's binary; the
stages change no arithmetic). H200, batch 64, 2,176 / 4,160 keys: 142 / 259 µs against 171 / 307
with 2 stages; batch 256 unchanged (``benchmarks/attention_fp8_tune.py``, 2026-12-04)."""
FP8_KV_LATE_V = True
"""Dequantize an FP8 cache's V tile after the Q·Kᵀ product instead of before it (same values,
bitwise): the BF16 K tile's shared memory is free again when V's is stored, 64 KB a program at 3
stages instead of 80, but 189 registers (sm_90, Triton 3.6; ``attention_fp8_resources.py``).
With ``FP8_KV_MAXNREG`` 168: three programs per SM instead of two. H100, 2026-12-05
(``attention_fp8_tune.py``): 64 × 4,160 keys 254 µs against 263, 256 × 2,176 504 against 539,
64 × 2,176 137 against 141 (one binary timed twice differed by 4 %); in a 16-layer decode at gen
4,096, batch 64, no change beyond noise (13,067 against 13,138 tok/s). The GPU tests that read
an FP8 cache pass with it."""
FP8_KV_MAXNREG: int | None = 168
"""Register cap (ptxas ``maxnreg``) of the FP8-cache forward; with ``FP8_KV_LATE_V`` at 3 stages,
168 fits three programs per SM instead of two, without spills in the sm_90 compile."""
DECODE_STAGES = 3
"""Pipeline stages of a BF16 call with one row tile per KV head (``G·Lq ≤ BLOCK_M``: a decode
step, a short chunk; the stages change no arithmetic). H200, decode over 448-4,160 keys: 10-16 %
faster than 2 stages, bitwise (``benchmarks/attention_kv_trip.py``, 2026-12-04). Longer calls
(the trainer's sequences, long prefills) keep ``NUM_STAGES``; so do FP16 (not measured) and head
size 256 (3 stages of its tiles would not fit in shared memory)."""
DECODE_BLOCK_M = 16
"""Row tile of a BF16 ``decode_tiles`` call (Lq = 1) with at most this many query heads per KV
head (module doc, "Decode tiles")."""
DQ_TILES = (128, 64, 8, 3)
"""(query rows, keys, warps, stages) of the backward's dQ kernel at head size ≤ 128. The
backward need not be invariant, so its tiles are free to tune, each kernel its own
(``benchmarks/attention_exact_sweep.py`` times candidates at the trainer's shape). H200,
Llama-3.1-8B heads, 4 × 4,096 causal, 2026-12-05: the backward took 12.57 ms with 64×64, 8 warps,
2 stages for both kernels (the tiles before), 6.61 ms with these; every candidate's gradients
were bitwise the old tiles' there (measured, max relative Δ 0.0; not a guarantee elsewhere)."""
DKDV_TILES = (64, 64, 4, 3)
"""(query rows, keys, warps, stages) of the backward's dK/dV kernel at head size ≤ 128 (see
``DQ_TILES``)."""
WIDE_BWD_TILES = (64, 64, 8, NUM_STAGES)
"""Both backward kernels' tiles at head size 256: the tiles before 2026-12-05, kept (the tuned
tiles were not swept or timed there; GPU-tested at 256 only with these)."""
_LOG2E = 1.4426950408889634

__all__ = ["BLOCK_M", "BLOCK_N", "exact_attention"]


@triton.jit(do_not_specialize=["Lq", "Lk", "R", "G", "HKV"])
def _fwd_kernel(
    Q, K, V, KS, VS, OUT, LSE, NVIS, Lq, Lk, R, G, HKV, qk_scale,
    sqb, sqh, sqm, skb, skh, skn, svb, svh, svn, sob, soh, som,
    D: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, KV_FP8: tl.constexpr,
    LATE_V: tl.constexpr,
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
    nvis = tl.minimum(tl.load(NVIS + b * Lq + pos, mask=row_ok, other=0), Lk)  # keys given only
    hi = tl.max(nvis, 0)
    k_base = K + b.to(tl.int64) * skb + hk.to(tl.int64) * skh
    v_base = V + b.to(tl.int64) * svb + hk.to(tl.int64) * svh
    if KV_FP8:
        k_scale = tl.load(KS)
        v_scale = tl.load(VS)

    m_i = tl.full([BM], float("-inf"), tl.float32)
    l_i = tl.zeros([BM], tl.float32)
    acc = tl.zeros([BM, D], tl.float32)
    for start in range(0, hi, BN):
        cols = start + tl.arange(0, BN)
        col_ok = cols < hi
        k = tl.load(
            k_base + cols.to(tl.int64)[:, None] * skn + d[None, :], mask=col_ok[:, None], other=0.0
        )
        v = tl.load(
            v_base + cols.to(tl.int64)[:, None] * svn + d[None, :], mask=col_ok[:, None], other=0.0
        )
        if KV_FP8:  # an FP8 cache read in place: kv.kv_dequantize's values, bitwise
            k = (k.to(tl.float32) * k_scale).to(q.dtype)
            if not LATE_V:
                v = (v.to(tl.float32) * v_scale).to(q.dtype)
        s = tl.dot(q, tl.trans(k))
        if KV_FP8 and LATE_V:  # the same values, computed after Q·Kᵀ (FP8_KV_LATE_V)
            v = (v.to(tl.float32) * v_scale).to(q.dtype)
        s = s * qk_scale
        s = tl.where(cols[None, :] < nvis[:, None], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.math.exp2(m_i - m_new)
        p = tl.math.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None]
        acc = tl.dot(p.to(v.dtype), v, acc)
        m_i = m_new
    out = acc / l_i[:, None]
    o_off = b.to(tl.int64) * sob + head.to(tl.int64) * soh + pos.to(tl.int64) * som
    tl.store(OUT + o_off[:, None] + d[None, :], out.to(OUT.dtype.element_ty), mask=row_ok[:, None])
    # log2-domain log-sum-exp of the scaled scores [B, H, Lq], stored by every call so that the
    # trainer (which needs it) and the engine run one kernel, one arithmetic (only num_stages
    # differs between their binaries)
    lse_off = (b * HKV * G + head) * Lq + pos
    tl.store(LSE + lse_off, m_i + tl.math.log2(l_i), mask=row_ok)


@triton.jit(do_not_specialize=["Lq", "Lk", "R", "G", "HKV"])
def _bwd_dq_kernel(
    Q, K, V, DO, DQ, LSE, DELTA, NVIS, Lq, Lk, R, G, HKV, qk_scale, sm_scale,
    sqb, sqh, sqm, skb, skh, skn, svb, svh, svn, sdob, sdoh, sdom, sdqb, sdqh, sdqm,
    D: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
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
    bl, hl, pl = b.to(tl.int64), head.to(tl.int64), pos.to(tl.int64)
    q = tl.load(
        Q + (bl * sqb + hl * sqh + pl * sqm)[:, None] + d[None, :], mask=row_ok[:, None], other=0.0
    )
    do = tl.load(
        DO + (bl * sdob + hl * sdoh + pl * sdom)[:, None] + d[None, :],
        mask=row_ok[:, None],
        other=0.0,
    )
    stat = (b * HKV * G + head) * Lq + pos
    lse = tl.load(LSE + stat, mask=row_ok, other=0.0)
    delta = tl.load(DELTA + stat, mask=row_ok, other=0.0)
    nvis = tl.minimum(tl.load(NVIS + b * Lq + pos, mask=row_ok, other=0), Lk)  # keys given only
    hi = tl.max(nvis, 0)
    k_base = K + bl * skb + hk.to(tl.int64) * skh
    v_base = V + bl * svb + hk.to(tl.int64) * svh
    dq = tl.zeros([BM, D], tl.float32)
    for start in range(0, hi, BN):
        cols = start + tl.arange(0, BN)
        col_ok = cols < hi
        k = tl.load(
            k_base + cols.to(tl.int64)[:, None] * skn + d[None, :], mask=col_ok[:, None], other=0.0
        )
        v = tl.load(
            v_base + cols.to(tl.int64)[:, None] * svn + d[None, :], mask=col_ok[:, None], other=0.0
        )
        s = tl.dot(q, tl.trans(k)) * qk_scale
        p = tl.math.exp2(s - lse[:, None])
        p = tl.where(cols[None, :] < nvis[:, None], p, 0.0)
        dp = tl.dot(do, tl.trans(v))
        ds = p * (dp - delta[:, None])
        dq = tl.dot(ds.to(k.dtype), k, dq)
    dq = dq * sm_scale
    dq_off = bl * sdqb + hl * sdqh + pl * sdqm
    tl.store(DQ + dq_off[:, None] + d[None, :], dq.to(DQ.dtype.element_ty), mask=row_ok[:, None])


@triton.jit(do_not_specialize=["Lq", "Lk", "R", "G", "HKV"])
def _bwd_dkdv_kernel(
    Q, K, V, DO, DK, DV, LSE, DELTA, NVIS, Lq, Lk, R, G, HKV, qk_scale, sm_scale,
    sqb, sqh, sqm, skb, skh, skn, svb, svh, svn, sdob, sdoh, sdom,
    D: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
):  # fmt: skip
    pid_n = tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = pid_bh // HKV
    hk = pid_bh % HKV
    bl = b.to(tl.int64)
    cols = pid_n * BN + tl.arange(0, BN)
    col_ok = cols < Lk
    d = tl.arange(0, D)
    k_off = bl * skb + hk.to(tl.int64) * skh + cols.to(tl.int64) * skn
    v_off = bl * svb + hk.to(tl.int64) * svh + cols.to(tl.int64) * svn
    k = tl.load(K + k_off[:, None] + d[None, :], mask=col_ok[:, None], other=0.0)
    v = tl.load(V + v_off[:, None] + d[None, :], mask=col_ok[:, None], other=0.0)
    dk = tl.zeros([BN, D], tl.float32)
    dv = tl.zeros([BN, D], tl.float32)
    first_col = pid_n * BN
    for start in range(0, R, BM):
        rows = start + tl.arange(0, BM)
        row_ok = rows < R
        head = hk * G + rows // Lq
        pos = rows % Lq
        nvis = tl.minimum(tl.load(NVIS + b * Lq + pos, mask=row_ok, other=0), Lk)
        if tl.max(nvis, 0) > first_col:  # some row of this block sees some key of ours
            hl, pl = head.to(tl.int64), pos.to(tl.int64)
            q_off = bl * sqb + hl * sqh + pl * sqm
            do_off = bl * sdob + hl * sdoh + pl * sdom
            q = tl.load(Q + q_off[:, None] + d[None, :], mask=row_ok[:, None], other=0.0)
            do = tl.load(DO + do_off[:, None] + d[None, :], mask=row_ok[:, None], other=0.0)
            stat = (b * HKV * G + head) * Lq + pos
            lse = tl.load(LSE + stat, mask=row_ok, other=0.0)
            delta = tl.load(DELTA + stat, mask=row_ok, other=0.0)
            s = tl.dot(q, tl.trans(k)) * qk_scale
            p = tl.math.exp2(s - lse[:, None])
            p = tl.where((cols[None, :] < nvis[:, None]) & col_ok[None, :], p, 0.0)
            dv = tl.dot(tl.trans(p.to(do.dtype)), do, dv)
            dp = tl.dot(do, tl.trans(v))
            ds = p * (dp - delta[:, None])
            dk = tl.dot(tl.trans(ds.to(q.dtype)), q, dk)
    dk = dk * sm_scale
    tl.store(DK + k_off[:, None] + d[None, :], dk.to(DK.dtype.element_ty), mask=col_ok[:, None])
    tl.store(DV + v_off[:, None] + d[None, :], dv.to(DV.dtype.element_ty), mask=col_ok[:, None])


def _check(q: Tensor, k: Tensor, v: Tensor, n_visible: Tensor) -> None:
    b, h, lq, d = q.shape
    if k.shape != v.shape or k.shape[0] != b or k.shape[3] != d or h % k.shape[1]:
        raise ValueError(f"q {tuple(q.shape)} / k {tuple(k.shape)} / v {tuple(v.shape)} mismatch")
    if n_visible.shape != (b, lq):
        raise ValueError(f"n_visible {tuple(n_visible.shape)} is not [B, Lq] = {(b, lq)}")
    if d not in (16, 32, 64, 128, 256):
        raise ValueError(f"head dim {d} is not a power of two in [16, 256]")


def _last_dim_contiguous(t: Tensor) -> Tensor:
    return t if t.stride(-1) == 1 else t.contiguous()


def _forward(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    nvis: Tensor,
    scale: float,
    k_scale: Tensor | None = None,
    v_scale: Tensor | None = None,
    decode_tiles: bool = False,
) -> tuple[Tensor, Tensor]:
    b, h, lq, d = q.shape
    fp8 = k.dtype == torch.float8_e4m3fn
    hkv, lk = k.shape[1], k.shape[2]
    g = h // hkv
    out = torch.empty(b, h, lq, d, dtype=q.dtype, device=q.device)
    lse = torch.empty(b, h, lq, dtype=torch.float32, device=q.device)
    r = g * lq
    bm, stages = BLOCK_M, FP8_KV_STAGES if fp8 else NUM_STAGES
    bf16 = q.dtype == torch.bfloat16 and not fp8
    if decode_tiles and bf16 and lq == 1 and r <= DECODE_BLOCK_M:
        bm = DECODE_BLOCK_M  # 2 stages: the fastest there (attention_decode_tile.py)
    elif bf16 and r <= BLOCK_M and d <= 128:  # 3 stages of 256-wide tiles overflow smem
        stages = DECODE_STAGES
    grid = (triton.cdiv(r, bm), b * hkv)
    cap = {"maxnreg": FP8_KV_MAXNREG} if fp8 and FP8_KV_MAXNREG else {}
    _fwd_kernel[grid](
        q, k, v, k_scale if fp8 else q, v_scale if fp8 else q, out, lse, nvis, lq, lk, r, g, hkv,
        scale * _LOG2E,
        q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
        v.stride(0), v.stride(1), v.stride(2), out.stride(0), out.stride(1), out.stride(2),
        D=d, BM=bm, BN=BLOCK_N, KV_FP8=fp8, LATE_V=fp8 and FP8_KV_LATE_V,
        num_warps=NUM_WARPS, num_stages=stages, **cap,
    )  # fmt: skip
    return out, lse


class _ExactAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, nvis, scale):
        out, lse = _forward(q, k, v, nvis, scale)
        ctx.save_for_backward(q, k, v, nvis, out, lse)
        ctx.scale = scale
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out):
        q, k, v, nvis, out, lse = ctx.saved_tensors
        do = _last_dim_contiguous(grad_out)
        if fused_bwd.applies(q, k):
            causal = fused_bwd.causal_rows(nvis)
            if fused_bwd.causal_or_silent(causal, do):
                grads = fused_bwd.backward(q, k, v, out, lse, do, ctx.scale, causal)
                if grads is not None:
                    return (*grads, None, None)
        k, v = k.contiguous(), v.contiguous()  # dK/dV are written with K/V's strides
        delta = (do.float() * out.float()).sum(-1).contiguous()  # [B, H, Lq]
        b, h, lq, d = q.shape
        hkv, lk = k.shape[1], k.shape[2]
        g = h // hkv
        r = g * lq
        dq = torch.empty_like(q, memory_format=torch.contiguous_format)
        dk, dv = torch.empty_like(k), torch.empty_like(v)
        qk_scale = ctx.scale * _LOG2E
        dq_tiles, kv_tiles = (DQ_TILES, DKDV_TILES) if d <= 128 else (WIDE_BWD_TILES,) * 2
        (dq_m, dq_n, dq_warps, dq_stages), (kv_m, kv_n, kv_warps, kv_stages) = dq_tiles, kv_tiles
        _bwd_dq_kernel[(triton.cdiv(r, dq_m), b * hkv)](
            q, k, v, do, dq, lse, delta, nvis, lq, lk, r, g, hkv, qk_scale, ctx.scale,
            q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
            v.stride(0), v.stride(1), v.stride(2), do.stride(0), do.stride(1), do.stride(2),
            dq.stride(0), dq.stride(1), dq.stride(2),
            D=d, BM=dq_m, BN=dq_n, num_warps=dq_warps, num_stages=dq_stages,
        )  # fmt: skip
        _bwd_dkdv_kernel[(triton.cdiv(lk, kv_n), b * hkv)](
            q, k, v, do, dk, dv, lse, delta, nvis, lq, lk, r, g, hkv, qk_scale, ctx.scale,
            q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
            v.stride(0), v.stride(1), v.stride(2), do.stride(0), do.stride(1), do.stride(2),
            D=d, BM=kv_m, BN=kv_n, num_warps=kv_warps, num_stages=kv_stages,
        )  # fmt: skip
        return dq, dk, dv, None, None


def exact_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    n_visible: Tensor,
    *,
    scale: float,
    k_scale: Tensor | None = None,
    v_scale: Tensor | None = None,
    decode_tiles: bool = False,
) -> Tensor:
    """Batch-invariant GQA attention over a prefix of keys per query row (CUDA, Triton).

    Args:
        q: [B, H, Lq, D] BF16/FP16 (any strides with the last dim contiguous).
        k, v: [B, Hkv, Lk, D], H a multiple of Hkv (e.g. KV-cache slices): q's dtype, or FP8
            E4M3 codes of an FP8 KV cache, read in place (no autograd).
        n_visible: [B, Lq] integer: query (b, l) sees keys ``[0, n_visible[b, l])``; must be
            >= 1 (``invariant.visible_keys``: ``min(position + 1, k_len)``, the prefix
            ``attention_mask`` marks); counts past Lk are clamped to Lk in the kernel (int32
            contiguous counts are passed as they are, without a copy).
        scale: softmax scale (usually D**-0.5).
        k_scale, v_scale: 0-d float32 per-tensor scales of FP8 k/v (``kv.kv_dequantize``'s; each
            tile is dequantized in registers to the same values, so an engine reading its FP8
            cache and a trainer attending over ``kv.kv_round_trip`` keys get the same bits).
        decode_tiles: run a BF16 decode call (Lq = 1, at most ``DECODE_BLOCK_M`` query heads
            per KV head) on 16-row tiles (module doc, "Decode tiles": faster, not bitwise the
            64-row rows; fast mode only).
    Returns:
        [B, H, Lq, D] in q.dtype; differentiable once in q, k, v (fp32 accumulation, no
        [Lq, Lk] buffer): the trainer's whole-sequence calls on Hopper run cuDNN's fused backward
        (``attention_cudnn_bwd``: measured run-to-run identical, not promised), the rest the
        Triton kernels (deterministic).
    Raises:
        ValueError: shapes disagree, the head dim is not a power of two in [16, 256], FP8 k/v
            come without their scales or under autograd.
    """
    _check(q, k, v, n_visible)
    q, k, v = _last_dim_contiguous(q), _last_dim_contiguous(k), _last_dim_contiguous(v)
    nvis = n_visible.to(torch.int32).contiguous()  # a no-op on visible_keys' counts
    grad = torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad)
    if k.dtype == torch.float8_e4m3fn or v.dtype == torch.float8_e4m3fn:
        if k.dtype != v.dtype or k_scale is None or v_scale is None or grad:
            raise ValueError(
                "FP8 k/v need both in E4M3 with k_scale and v_scale, and no autograd (a KV cache)"
            )
        return _forward(q, k, v, nvis, float(scale), k_scale.float(), v_scale.float())[0]
    if grad:
        return _ExactAttention.apply(q, k, v, nvis, float(scale))
    return _forward(q, k, v, nvis, float(scale), decode_tiles=decode_tiles)[0]
