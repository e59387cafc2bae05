"""Triton RoPE + KV-cache write: one launch for q's rotation and k/v's (FP8) cache store (GPU only).

Design notes
------------
* One program per (token, head) row of ``D`` elements: heads ``0..H-1`` rotate a query head into
  ``q_out``; heads ``H..H+Hkv-1`` rotate a key head and store it, and the matching value head, at
  the token's position in the caches. At decode sizes this replaces ~14 small torch kernels per
  layer (float copies, ``cat``, three multiplies/adds, casts, two scatters; ~22 with an FP8 cache).
* **Bitwise the torch composition** (``rope_kv.rope_kv_write_reference``), not just close: RoPE is
  ``x·cos + rotate_half(x)·sin`` in float32 with each product and the sum rounded separately
  (``enable_fp_fusion=False``: no FMA contraction, like torch's separate elementwise kernels),
  then one rounding to the activation dtype; the FP8 cache codes are
  ``clamp(div_rn(x, scale), ±448)`` cast to E4M3 (``quant_triton._to_codes``, the rule of
  ``kv.kv_quantize``). Exact mode may therefore run it too: the trainer's ``apply_rope`` /
  ``kv_round_trip`` see the same bits.
* The scales are read from device memory (0-d tensors), so a captured CUDA graph picks up the
  scales of each weight update.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from fp8rl.kernels.quant_triton import _to_codes


@triton.jit
def _rotated(ptr, offs_d, HALF: tl.constexpr):
    """``x·cos`` partner of rotate-half: ``-x[d+HALF]`` for ``d < HALF``, ``x[d-HALF]`` after (float32)."""
    partner = tl.where(offs_d < HALF, offs_d + HALF, offs_d - HALF)
    x = tl.load(ptr + partner).to(tl.float32)
    return tl.where(offs_d < HALF, -x, x)


@triton.jit
def _rope_kv_write_kernel(
    q_ptr, k_ptr, v_ptr, cos_ptr, sin_ptr, pos_ptr, q_out_ptr, k_cache_ptr, v_cache_ptr,
    k_scale_ptr, v_scale_ptr, length, heads,
    sq_b, sq_l, sq_h, sk_b, sk_l, sk_h, sv_b, sv_l, sv_h, sr_b, sr_l, sp_b, sp_l,
    so_b, so_h, so_l, sc_b, sc_h, sc_p,
    D: tl.constexpr, FP8_CACHE: tl.constexpr,
):  # fmt: skip
    token, head = tl.program_id(0), tl.program_id(1)
    b, t = token // length, token % length
    offs_d = tl.arange(0, D)
    rope_row = b.to(tl.int64) * sr_b + t * sr_l + offs_d
    cos = tl.load(cos_ptr + rope_row)
    sin = tl.load(sin_ptr + rope_row)
    if head < heads:
        src = q_ptr + b.to(tl.int64) * sq_b + t * sq_l + head * sq_h
        x = tl.load(src + offs_d)
        out = (x.to(tl.float32) * cos + _rotated(src, offs_d, D // 2) * sin).to(x.dtype)
        dst = q_out_ptr + b.to(tl.int64) * so_b + head * so_h + t * so_l
        tl.store(dst + offs_d, out)
    else:
        kv_head = head - heads
        pos = tl.load(pos_ptr + b.to(tl.int64) * sp_b + t * sp_l)
        slot = b.to(tl.int64) * sc_b + kv_head * sc_h + pos * sc_p + offs_d
        src = k_ptr + b.to(tl.int64) * sk_b + t * sk_l + kv_head * sk_h
        x = tl.load(src + offs_d)
        key = (x.to(tl.float32) * cos + _rotated(src, offs_d, D // 2) * sin).to(x.dtype)
        value = tl.load(v_ptr + b.to(tl.int64) * sv_b + t * sv_l + kv_head * sv_h + offs_d)
        if FP8_CACHE:
            k_scale = tl.load(k_scale_ptr + tl.zeros_like(offs_d))
            v_scale = tl.load(v_scale_ptr + tl.zeros_like(offs_d))
            tl.store(k_cache_ptr + slot, _to_codes(key.to(tl.float32), k_scale))
            tl.store(v_cache_ptr + slot, _to_codes(value.to(tl.float32), v_scale))
        else:
            tl.store(k_cache_ptr + slot, key)
            tl.store(v_cache_ptr + slot, value)


def rope_kv_write_triton(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    cos: Tensor,
    sin: Tensor,
    positions: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    k_scale: Tensor | None,
    v_scale: Tensor | None,
) -> Tensor:
    """Shapes and result as ``rope_kv.rope_kv_write`` (inputs already validated there)."""
    b, length, heads, d = q.shape
    kv_heads = k.shape[2]
    # the strides torch's apply_rope gives the transposed view (a single token: contiguous)
    if length == 1:
        q_out = torch.empty(b, heads, 1, d, dtype=q.dtype, device=q.device)
    else:
        q_out = torch.empty(b, length, heads, d, dtype=q.dtype, device=q.device).transpose(1, 2)
    fp8 = k_cache.dtype == torch.float8_e4m3fn
    k_scale = k_scale if fp8 else cos  # unread without an FP8 cache
    v_scale = v_scale if fp8 else cos
    if b * length:
        _rope_kv_write_kernel[(b * length, heads + kv_heads)](
            q, k, v, cos, sin, positions, q_out, k_cache, v_cache, k_scale, v_scale, length, heads,
            *q.stride()[:3], *k.stride()[:3], *v.stride()[:3], *cos.stride()[:2],
            *positions.stride(), q_out.stride(0), q_out.stride(1), q_out.stride(2),
            *k_cache.stride()[:3], D=d, FP8_CACHE=fp8, num_warps=1, enable_fp_fusion=False,
        )  # fmt: skip
    return q_out
