"""RoPE of q and k plus the KV-cache write of an inference step, fused on CUDA (issue 14, deliver 2).

Design notes
------------
* An engine step with a KV cache rotates q and k (``invariant.apply_rope``), optionally codes k
  and v for an FP8 cache (``kv.kv_quantize``, per-tensor scales) and stores them at each token's
  position. As torch ops that is ~14 kernels per layer (~22 with an FP8 cache), most of them a
  few microseconds over a few kilobytes: at decode sizes they cost more than the data they move.
  ``rope_kv_write`` does it in one Triton kernel (``rope_kv_triton``).
* The fused kernel is **bitwise** ``rope_kv_write_reference`` (the torch composition, the CPU
  truth): same float32 products and sum rounded one by one, same FP8 rule. So the trainer, which
  runs ``apply_rope`` and ``kv_round_trip`` as torch ops, sees exactly the keys and queries an
  engine computes, in fast and in exact mode. ``tests/fp8_kernels/test_rope_kv_gpu.py`` checks it.
* The returned queries have the memory layout torch's ``apply_rope`` gives a transposed input
  (``[B, L, H, D]`` storage viewed as ``[B, H, L, D]``), so attention receives the same strides.
"""

from __future__ import annotations

import torch
from torch import Tensor

from fp8rl.kernels.invariant import apply_rope
from fp8rl.kernels.kv import kv_quantize

_FUSED = [True]
"""Whether CUDA runs the fused kernel (see ``set_fused``)."""


def set_fused(on: bool) -> None:
    """Run the fused kernel where it applies (default), or always the torch composition (the
    benchmark baseline, ``benchmarks/rollout.py --rope-kv off``). Results are bitwise the same."""
    _FUSED[0] = bool(on)


def rope_kv_write_reference(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    cos: Tensor,
    sin: Tensor,
    positions: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    k_scale: Tensor | None = None,
    v_scale: Tensor | None = None,
) -> Tensor:
    """The torch composition ``rope_kv_write`` fuses (any device). Arguments as there."""
    q_rot = apply_rope(q.transpose(1, 2), cos, sin)
    k_rot = apply_rope(k.transpose(1, 2), cos, sin)
    v_t = v.transpose(1, 2)
    if k_cache.dtype == torch.float8_e4m3fn:
        k_rot, v_t = kv_quantize(k_rot, k_scale), kv_quantize(v_t, v_scale)
        k_cache, v_cache = k_cache.view(torch.uint8), v_cache.view(torch.uint8)
        k_rot, v_t = k_rot.view(torch.uint8), v_t.view(torch.uint8)  # CPU has no FP8 scatter
    index = positions[:, None, :, None].expand(-1, k.shape[2], -1, k.shape[3])
    k_cache.scatter_(2, index, k_rot)
    v_cache.scatter_(2, index, v_t)
    return q_rot


def _fusable(q, k, v, cos, sin, positions, k_cache, v_cache) -> bool:
    from fp8rl.kernels.backend import triton_available

    d = q.shape[-1]
    return (
        _FUSED[0]
        and q.is_cuda
        and triton_available()
        and d >= 16
        and d & (d - 1) == 0
        and all(t.stride(-1) == 1 for t in (q, k, v, k_cache))
        and cos.is_contiguous()
        and sin.is_contiguous()
        and cos.dtype == sin.dtype == torch.float32
        and positions.dtype == torch.int64
        and k_cache.stride() == v_cache.stride()
        and k_cache.dtype == v_cache.dtype
        and (k_cache.dtype == torch.float8_e4m3fn or k_cache.dtype == q.dtype == k.dtype == v.dtype)
    )


def rope_kv_write(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    cos: Tensor,
    sin: Tensor,
    positions: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    k_scale: Tensor | None = None,
    v_scale: Tensor | None = None,
) -> Tensor:
    """Rotate q and k (rotate-half RoPE) and store k, v at their positions in the KV cache.

    Args:
        q: ``[B, L, H, D]`` queries; k, v: ``[B, L, Hkv, D]`` keys/values (any strides with a
            unit last stride, e.g. views of a fused qkv output); compute dtype.
        cos, sin: ``[B, L, D]`` float32 rows of ``invariant.rope_table`` at the tokens' positions.
        positions: ``[B, L]`` int64 cache index of each token (``< capacity``, distinct per row).
        k_cache, v_cache: ``[B, Hkv, capacity, D]`` in the compute dtype, or ``float8_e4m3fn``
            for an FP8 cache (then ``k_scale``/``v_scale``, 0-d float32 calibrated scales, code
            the stored values as ``kv.kv_quantize`` does).
    Returns:
        The rotated queries ``[B, H, L, D]`` in q's dtype (``apply_rope(q.transpose(1, 2), …)``,
        same values and memory layout). The caches are written in place.
    Raises:
        ValueError: an FP8 cache without its scales.
    Source: Su et al. 2021 (RoPE, rotate-half form as in Hugging Face Llama); the fused kernel
    is bitwise ``rope_kv_write_reference``.
    """
    if k_cache.dtype == torch.float8_e4m3fn and (k_scale is None or v_scale is None):
        raise ValueError("rope_kv_write: an FP8 KV cache needs k_scale and v_scale")
    if _fusable(q, k, v, cos, sin, positions, k_cache, v_cache):
        from fp8rl.kernels.rope_kv_triton import rope_kv_write_triton

        return rope_kv_write_triton(
            q, k, v, cos, sin, positions, k_cache, v_cache, k_scale, v_scale
        )
    return rope_kv_write_reference(q, k, v, cos, sin, positions, k_cache, v_cache, k_scale, v_scale)
