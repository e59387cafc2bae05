"""Split-KV (flash-decoding) attention over a BF16 or FP8 E4M3 KV cache: the Triton kernels.

Public wrapper and pure-torch reference: ``fp8rl.kernels.decode_attention`` (this module is
imported only when a CUDA tensor reaches it).

Design notes
------------
* **One program per (sequence, KV head, split).** The query heads that share a KV head (GQA
  group) and the step's few query positions are packed as the M rows of ``tl.dot``
  (``groups × Lq`` rows padded to ``BLOCK_M`` ≥ 16), so each K/V tile is read from HBM once for
  the whole group. Row ``r`` is query head ``hk·groups + r // Lq`` at step position ``r % Lq``.
* **Only the valid keys.** The program of split ``s`` covers keys
  ``[s·split_len, min((s+1)·split_len, k_len[b], capacity))``; ``k_len`` is read from device
  memory, so a captured CUDA graph replays with the lengths of the moment, and ``capacity`` (the
  cache view's length) keeps a too-large ``k_len`` inside the view. Key ``j`` is visible to a
  query at position ``p`` iff ``j ≤ p`` and ``j < k_len`` (``invariant.attention_mask``).
* **FP8 in registers.** An FP8 tile is dequantized after the load as
  ``(code · scale)`` in float32 rounded to the query dtype, which is bitwise what
  ``kv.kv_dequantize`` (and the trainer's ``kv_round_trip``) computes; no dequantized copy of the
  cache exists.
* **Online softmax in float32** with base-2 exponentials (scores pre-multiplied by
  ``scale · log2 e``); P is rounded to the cache's compute dtype for the P·V ``tl.dot``
  (as flash attention does). Running maxima start at a finite ``-1e30`` so a split with no
  visible key yields ``m = -1e30, l = 0, acc = 0`` without NaNs.
* **Reduce.** With more than one split, each split writes its float32 ``(m, l, acc)`` for the
  valid rows; ``_reduce_kernel`` merges splits in index order (0, 1, …), so results are
  deterministic run to run. With one split the kernel normalizes and writes the output itself.
"""

from __future__ import annotations

import triton
import triton.language as tl

NEG_INIT = tl.constexpr(-1.0e30)
"""Initial running maximum (finite, so empty splits stay NaN-free)."""


@triton.jit
def _split_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    pos_ptr,
    klen_ptr,
    k_scale_ptr,
    v_scale_ptr,
    m_ptr,
    l_ptr,
    acc_ptr,
    o_ptr,
    qk_scale,
    split_len,
    num_splits,
    capacity,
    stride_qb,
    stride_qh,
    stride_ql,
    stride_kb,
    stride_kh,
    stride_kn,
    stride_vb,
    stride_vh,
    stride_vn,
    stride_pb,
    stride_ob,
    stride_oh,
    stride_ol,
    GROUPS: tl.constexpr,
    LQ: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    ONE_SPLIT: tl.constexpr,
    KV_FP8: tl.constexpr,
):
    b = tl.program_id(0)
    hk = tl.program_id(1)
    s = tl.program_id(2)
    num_kv_heads = tl.num_programs(1)
    rows = tl.arange(0, BLOCK_M)
    row_ok = rows < GROUPS * LQ
    head = hk * GROUPS + rows // LQ
    step = rows % LQ
    d = tl.arange(0, HEAD_DIM)
    q = tl.load(
        q_ptr + b * stride_qb + head[:, None] * stride_qh + step[:, None] * stride_ql + d[None, :],
        mask=row_ok[:, None],
        other=0.0,
    )
    q_pos = tl.load(pos_ptr + b * stride_pb + step, mask=row_ok, other=0)
    k_len = tl.load(klen_ptr + b)
    start = s * split_len
    end = tl.minimum(tl.minimum(start + split_len, k_len), capacity)  # never past the view
    if KV_FP8:
        k_scale = tl.load(k_scale_ptr)
        v_scale = tl.load(v_scale_ptr)
    k_base = k_ptr + b * stride_kb + hk * stride_kh
    v_base = v_ptr + b * stride_vb + hk * stride_vh
    m_i = tl.full([BLOCK_M], NEG_INIT, tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    for n0 in range(start, end, BLOCK_N):
        n = n0 + tl.arange(0, BLOCK_N)
        n_ok = n < end
        k = tl.load(k_base + n[None, :] * stride_kn + d[:, None], mask=n_ok[None, :], other=0.0)
        if KV_FP8:
            k = (k.to(tl.float32) * k_scale).to(q.dtype)
        scores = tl.dot(q, k) * qk_scale
        visible = n_ok[None, :] & (n[None, :] <= q_pos[:, None])
        scores = tl.where(visible, scores, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(scores, 1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(scores - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(v_base + n[:, None] * stride_vn + d[None, :], mask=n_ok[:, None], other=0.0)
        if KV_FP8:
            v = (v.to(tl.float32) * v_scale).to(q.dtype)
        acc = acc * alpha[:, None] + tl.dot(p.to(q.dtype), v)
        m_i = m_new
    if ONE_SPLIT:
        out = acc / l_i[:, None]
        o_rows = o_ptr + b * stride_ob + head[:, None] * stride_oh + step[:, None] * stride_ol
        tl.store(o_rows + d[None, :], out.to(o_ptr.dtype.element_ty), mask=row_ok[:, None])
    else:
        slot = ((b * num_kv_heads + hk) * num_splits + s) * BLOCK_M + rows
        tl.store(m_ptr + slot, m_i, mask=row_ok)
        tl.store(l_ptr + slot, l_i, mask=row_ok)
        tl.store(acc_ptr + slot[:, None] * HEAD_DIM + d[None, :], acc, mask=row_ok[:, None])


@triton.jit
def _reduce_kernel(
    m_ptr,
    l_ptr,
    acc_ptr,
    o_ptr,
    num_splits,
    stride_ob,
    stride_oh,
    stride_ol,
    GROUPS: tl.constexpr,
    LQ: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr,
):
    b = tl.program_id(0)
    hk = tl.program_id(1)
    num_kv_heads = tl.num_programs(1)
    rows = tl.arange(0, BLOCK_M)
    row_ok = rows < GROUPS * LQ
    d = tl.arange(0, HEAD_DIM)
    base = (b * num_kv_heads + hk) * num_splits * BLOCK_M + rows
    m_max = tl.full([BLOCK_M], NEG_INIT, tl.float32)
    for s in range(num_splits):
        m_max = tl.maximum(m_max, tl.load(m_ptr + base + s * BLOCK_M, mask=row_ok, other=NEG_INIT))
    l_sum = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    for s in range(num_splits):  # fixed order: deterministic
        slot = base + s * BLOCK_M
        w = tl.exp2(tl.load(m_ptr + slot, mask=row_ok, other=NEG_INIT) - m_max)
        l_sum += w * tl.load(l_ptr + slot, mask=row_ok, other=0.0)
        part = tl.load(
            acc_ptr + slot[:, None] * HEAD_DIM + d[None, :], mask=row_ok[:, None], other=0.0
        )
        acc += w[:, None] * part
    out = acc / l_sum[:, None]
    head = hk * GROUPS + rows // LQ
    step = rows % LQ
    o_rows = o_ptr + b * stride_ob + head[:, None] * stride_oh + step[:, None] * stride_ol
    tl.store(o_rows + d[None, :], out.to(o_ptr.dtype.element_ty), mask=row_ok[:, None])
