"""Triton quantizers, bitwise equal to the torch references in ``quant.py`` (GPU only).

Design notes
------------
* Bitwise parity with the references is a requirement, not an aim: the scale is computed with
  ``tl.math.div_rn`` (Triton's ``/`` on float32 is the approximate ``div.full``), floored at
  ``MIN_SCALE`` with ``tl.maximum``, rounded up to a power of two on the bits; codes are
  ``div_rn(x, scale)`` clamped to ±448 *before* ``.to(tl.float8e4nv)`` (round to nearest even,
  saturating on sm_90). ``tests/fp8_kernels/test_kernels_gpu.py`` checks equality on random and edge data.
* NaN would vanish in ``tl.max`` (max.f32 returns the non-NaN operand), so NaN is mapped to +inf
  before the amax: a group with NaN or inf gets an infinite scale, which the public wrapper's
  one ``isfinite`` reduction over the scales turns into a ``ValueError``.
* Layouts are chosen for the consumer: the 1×128 quantizer writes its scales M-major (the
  ``[M, ceil(K/128)]`` logical grid with stride ``(1, M)``, what ``scaled_mm`` wants), and the
  128×1 quantizers write codes and scales token-contiguous (``[K, M]`` storage), so ``q.t()`` is
  the contiguous 1×128 WGrad operand. The logical shapes are those of the references.
* Each program handles whole groups (no cross-program reduction), so results are independent of
  the grid, i.e. of M. Only this module imports Triton; it is imported lazily on CUDA.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from fp8rl.kernels.quant import FP8_DTYPE, FP8_E4M3_MAX, GROUP, MIN_SCALE, QuantizedTensor

_FP8_MAX = tl.constexpr(FP8_E4M3_MAX)
_MIN_SCALE = tl.constexpr(MIN_SCALE)
_INF = tl.constexpr(float("inf"))


@triton.jit
def _scale_from_amax(amax, POW2: tl.constexpr):
    scale = tl.maximum(tl.math.div_rn(amax, tl.full(amax.shape, 448.0, tl.float32)), _MIN_SCALE)
    if POW2:
        bits = scale.to(tl.int32, bitcast=True)
        exponent = bits & 0x7F800000
        bump = tl.where((bits & 0x007FFFFF) != 0, 0x00800000, 0)
        scale = (exponent + bump).to(tl.float32, bitcast=True)
    return scale


@triton.jit
def _nan_to_inf_abs(x):
    return tl.where(x == x, tl.abs(x), _INF)


@triton.jit
def _to_codes(x, scale):
    q = tl.math.div_rn(x, scale)
    q = tl.minimum(tl.maximum(q, -_FP8_MAX), _FP8_MAX)
    return q.to(tl.float8e4nv)


@triton.jit
def _per_token_group_quant_kernel(
    x_ptr, codes_ptr, scale_ptr, rows, k, stride_x, stride_codes, stride_scale_group,
    POW2: tl.constexpr, BLOCK_R: tl.constexpr, GROUPS: tl.constexpr,
):  # fmt: skip
    """BLOCK_R rows × GROUPS consecutive 128-groups per program (one contiguous chunk per row)."""
    offs_r = tl.program_id(1) * BLOCK_R + tl.arange(0, BLOCK_R)
    offs_k = tl.program_id(0) * (GROUPS * 128) + tl.arange(0, GROUPS * 128)
    row_mask = offs_r < rows
    mask = row_mask[:, None] & (offs_k[None, :] < k)
    rows64 = offs_r.to(tl.int64)[:, None]
    x = tl.load(x_ptr + rows64 * stride_x + offs_k[None, :], mask=mask, other=0.0).to(tl.float32)
    grouped = tl.reshape(x, (BLOCK_R, GROUPS, 128))
    scale = _scale_from_amax(tl.max(_nan_to_inf_abs(grouped), axis=2), POW2)  # [BLOCK_R, GROUPS]
    codes = tl.reshape(_to_codes(grouped, scale[:, :, None]), (BLOCK_R, GROUPS * 128))
    tl.store(codes_ptr + rows64 * stride_codes + offs_k[None, :], codes, mask=mask)
    groups = tl.program_id(0) * GROUPS + tl.arange(0, GROUPS)
    scale_ptrs = scale_ptr + groups[None, :] * stride_scale_group + offs_r[:, None]
    tl.store(scale_ptrs, scale, mask=row_mask[:, None] & (groups[None, :] * 128 < k))


@triton.jit
def _per_block_quant_kernel(
    w_ptr, codes_ptr, scale_ptr, n, k, stride_w, stride_codes, stride_scale,
    POW2: tl.constexpr,
):  # fmt: skip
    bn, bk = tl.program_id(0), tl.program_id(1)
    offs_n = bn * 128 + tl.arange(0, 128)
    offs_k = bk * 128 + tl.arange(0, 128)
    mask = (offs_n[:, None] < n) & (offs_k[None, :] < k)
    rows64 = offs_n.to(tl.int64)[:, None]
    w = tl.load(w_ptr + rows64 * stride_w + offs_k[None, :], mask=mask, other=0.0).to(tl.float32)
    amax = tl.max(tl.max(_nan_to_inf_abs(w), axis=1), axis=0)
    scale = _scale_from_amax(tl.full((1,), 0.0, tl.float32) + amax, POW2)
    codes = _to_codes(w, tl.reshape(scale, (1, 1)))
    tl.store(codes_ptr + rows64 * stride_codes + offs_k[None, :], codes, mask=mask)
    tl.store(scale_ptr + bn * stride_scale + bk + tl.arange(0, 1), scale)


@triton.jit
def _column_group_quant_kernel(
    x_ptr, in_scale_ptr, codes_t_ptr, scale_ptr, m, k,
    stride_x, stride_in_scale_row, stride_in_scale_group, stride_codes_t, stride_scale,
    FROM_FP8: tl.constexpr, POW2: tl.constexpr, BLOCK_C: tl.constexpr,
):  # fmt: skip
    """128 rows × BLOCK_C columns per program; codes stored transposed ([K, M] storage)."""
    bm = tl.program_id(1)
    offs_m = bm * 128 + tl.arange(0, 128)
    offs_c = tl.program_id(0) * BLOCK_C + tl.arange(0, BLOCK_C)
    mask = (offs_m[:, None] < m) & (offs_c[None, :] < k)
    rows64 = offs_m.to(tl.int64)[:, None]
    x = tl.load(x_ptr + rows64 * stride_x + offs_c[None, :], mask=mask, other=0.0).to(tl.float32)
    if FROM_FP8:  # dequantize the saved 1x128 activation: one float32 multiply per element
        group = (tl.program_id(0) * BLOCK_C) // 128  # BLOCK_C divides 128: one group per tile
        row_scale = tl.load(
            in_scale_ptr + offs_m * stride_in_scale_row + group * stride_in_scale_group,
            mask=offs_m < m,
            other=0.0,
        )
        x = x * row_scale[:, None]
    scale = _scale_from_amax(tl.max(_nan_to_inf_abs(x), axis=0), POW2)
    codes = _to_codes(x, scale[None, :])
    cols64 = offs_c.to(tl.int64)[None, :]
    tl.store(codes_t_ptr + cols64 * stride_codes_t + offs_m[:, None], codes, mask=mask)
    tl.store(scale_ptr + bm * stride_scale + offs_c, scale, mask=offs_c < k)


def _pow2(scale_format: str) -> bool:
    return scale_format == "pow2"


def per_token_group_quant_triton(
    x: Tensor,
    *,
    scale_format: str = "fp32",
    block_r: int = 32,
    groups_per_program: int = 1,
    num_warps: int = 4,
) -> QuantizedTensor:
    """Triton 1×128 quantizer: ``x [..., K]`` → codes ``[..., K]``, scale ``[..., ceil(K/128)]``.

    Scales are stored M-major (logical shape, stride ``(1, M)`` once flattened). No finiteness
    check here (the public ``per_token_group_quant`` does it). Bitwise equal to the reference.
    ``block_r`` / ``groups_per_program`` / ``num_warps`` set the tile; the defaults (32 rows × one
    group, 4 warps) were the fastest of the H200 sweep (3.2-3.5 TB/s at 16K tokens).
    """
    k = x.shape[-1]
    x2 = x.reshape(-1, k)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    rows, groups = x2.shape[0], triton.cdiv(k, GROUP)
    codes = torch.empty(rows, k, dtype=FP8_DTYPE, device=x.device)
    scale_storage = torch.empty(groups, rows, dtype=torch.float32, device=x.device)
    gpp = min(groups_per_program, triton.next_power_of_2(max(groups, 1)))
    if rows and groups:
        grid = (triton.cdiv(groups, gpp), triton.cdiv(rows, block_r))
        _per_token_group_quant_kernel[grid](
            x2, codes, scale_storage, rows, k, x2.stride(0), codes.stride(0), scale_storage.stride(0),
            POW2=_pow2(scale_format), BLOCK_R=block_r, GROUPS=gpp, num_warps=num_warps,
        )  # fmt: skip
    lead = x.shape[:-1]
    return QuantizedTensor(codes.view(*lead, k), scale_storage.t().view(*lead, groups), (1, GROUP))


def per_block_quant_triton(
    w: Tensor, *, scale_format: str = "fp32", out: QuantizedTensor | None = None
) -> QuantizedTensor:
    """Triton 128×128 quantizer: ``w [N, K]`` → codes ``[N, K]``, scale ``[ceil(N/128), ceil(K/128)]``
    (written into ``out``'s row-major codes and scale when given)."""
    if w.stride(-1) != 1:
        w = w.contiguous()
    n, k = w.shape
    nb, kb = triton.cdiv(n, GROUP), triton.cdiv(k, GROUP)
    if out is not None:
        assert out.codes.stride(-1) == 1 and out.scale.stride(-1) == 1
        codes, scale = out.codes, out.scale
    else:
        codes = torch.empty(n, k, dtype=FP8_DTYPE, device=w.device)
        scale = torch.empty(nb, kb, dtype=torch.float32, device=w.device)
    if nb and kb:
        _per_block_quant_kernel[(nb, kb)](
            w, codes, scale, n, k, w.stride(0), codes.stride(0), scale.stride(0),
            POW2=_pow2(scale_format), num_warps=8,
        )  # fmt: skip
    return QuantizedTensor(codes, scale, (GROUP, GROUP))


def _column_quant(
    x: Tensor,
    in_scale: Tensor | None,
    *,
    scale_format: str,
    from_fp8: bool,
    block_c: int = 64,
    num_warps: int = 4,
) -> QuantizedTensor:
    if x.stride(-1) != 1:
        x = x.contiguous()
    m, k = x.shape
    mb = triton.cdiv(m, GROUP)
    codes_t = torch.empty(k, m, dtype=FP8_DTYPE, device=x.device)
    scale = torch.empty(mb, k, dtype=torch.float32, device=x.device)
    if in_scale is None:
        in_scale, in_strides = scale, (0, 0)  # unused when FROM_FP8 is False
    else:
        in_strides = (in_scale.stride(0), in_scale.stride(1))
    if mb and k:
        _column_group_quant_kernel[(triton.cdiv(k, block_c), mb)](
            x, in_scale, codes_t, scale, m, k, x.stride(0), *in_strides, codes_t.stride(0),
            scale.stride(0), FROM_FP8=from_fp8, POW2=_pow2(scale_format), BLOCK_C=block_c,
            num_warps=num_warps,
        )  # fmt: skip
    return QuantizedTensor(codes_t.t(), scale, (GROUP, 1))


def per_column_group_quant_triton(
    x: Tensor, *, scale_format: str = "fp32", block_c: int = 64, num_warps: int = 4
) -> QuantizedTensor:
    """Triton 128×1 quantizer: ``x [M, K]`` → codes ``[M, K]`` (K-major storage), scale ``[ceil(M/128), K]``."""
    return _column_quant(
        x, None, scale_format=scale_format, from_fp8=False, block_c=block_c, num_warps=num_warps
    )


def requant_to_column_groups_triton(
    q: QuantizedTensor, *, scale_format: str = "fp32", block_c: int = 64, num_warps: int = 4
) -> QuantizedTensor:
    """Triton re-quantization of a 2-D 1×128 ``q [M, K]`` into 128×1 groups (fused dequantize)."""
    assert q.block == (1, GROUP) and q.codes.dim() == 2
    return _column_quant(
        q.codes, q.scale, scale_format=scale_format, from_fp8=True, block_c=block_c,
        num_warps=num_warps,
    )  # fmt: skip
