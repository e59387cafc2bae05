"""Triton kernels that fuse the fast path's elementwise ops with the 1×128 FP8 activation quant.

Design notes
------------
* Decode is memory- and launch-bound: every unfused op is a kernel launch and a round trip of
  the activation through HBM. Two fusions cover the quantizer inputs of a decoder block:
  ``add_rms_norm_quant`` (residual add → RMSNorm → 1×128 quant, one row read once) feeds the
  fused q/k/v and gate/up GEMMs, ``silu_mul_quant`` (SiLU(gate)·up → 1×128 quant) feeds down_proj.
* The arithmetic repeats the unfused torch ops rounding for rounding: the residual sum and the
  normalised row are rounded to the activation dtype, the gain multiply is done in that dtype,
  SiLU and the product are rounded to it; then the quantizer of ``quant_triton`` (same
  ``_scale_from_amax``/``_to_codes``) runs on the rounded values. The only difference from the
  torch composition is the order of the mean-square reduction and ``rsqrt``'s rounding, so the
  fast path's codes match the unfused path on all but a few boundary elements. Exact mode never
  runs these kernels (it keeps the float64 invariant ops).
* A row is handled whole by one program (``H`` padded to a power of two), so results do not
  depend on the number of rows.
* Scales are written M-major (``[groups, rows]`` storage), the layout of
  ``per_token_group_quant_triton``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from fp8rl.kernels.quant import FP8_DTYPE, GROUP, QuantizedTensor
from fp8rl.kernels.quant_triton import _nan_to_inf_abs, _scale_from_amax, _to_codes


@triton.jit
def _quant_store_rows(y, codes_ptr, scale_ptr, offs_r, offs_k, first_group, rows, k, stride_codes,
                      stride_sg, POW2: tl.constexpr, BLOCK_R: tl.constexpr, WIDTH: tl.constexpr):  # fmt: skip
    """1×128-quantize ``y [BLOCK_R, WIDTH]`` (float32) and store codes + M-major scales."""
    grouped = tl.reshape(y, (BLOCK_R, WIDTH // 128, 128))
    row_mask = offs_r < rows
    scale = _scale_from_amax(tl.max(_nan_to_inf_abs(grouped), axis=2), POW2)
    scale = tl.where(row_mask[:, None], scale, 1.0)  # padding rows: no slow-path division
    codes = tl.reshape(_to_codes(grouped, scale[:, :, None]), (BLOCK_R, WIDTH))
    mask = row_mask[:, None] & (offs_k[None, :] < k)
    rows64 = offs_r.to(tl.int64)[:, None]
    tl.store(codes_ptr + rows64 * stride_codes + offs_k[None, :], codes, mask=mask)
    groups = first_group + tl.arange(0, WIDTH // 128)
    scale_ptrs = scale_ptr + groups[None, :] * stride_sg + offs_r[:, None]
    tl.store(scale_ptrs, scale, mask=row_mask[:, None] & (groups[None, :] * 128 < k))


@triton.jit
def _add_rms_norm_quant_kernel(
    x_ptr, d_ptr, res_ptr, w_ptr, codes_ptr, scale_ptr, rows, h, eps,
    stride_x, stride_d, stride_res, stride_codes, stride_sg,
    HAS_DELTA: tl.constexpr, POW2: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_H: tl.constexpr,
):  # fmt: skip
    offs_r = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    offs_h = tl.arange(0, BLOCK_H)
    mask = (offs_r < rows)[:, None] & (offs_h < h)[None, :]
    rows64 = offs_r.to(tl.int64)[:, None]
    x = tl.load(x_ptr + rows64 * stride_x + offs_h[None, :], mask=mask, other=0.0)
    if HAS_DELTA:  # residual add, rounded to the activation dtype like torch's x + delta
        d = tl.load(d_ptr + rows64 * stride_d + offs_h[None, :], mask=mask, other=0.0)
        x = (x.to(tl.float32) + d.to(tl.float32)).to(x.dtype)
        tl.store(res_ptr + rows64 * stride_res + offs_h[None, :], x, mask=mask)
    xf = x.to(tl.float32)
    inv = tl.math.rsqrt(tl.sum(xf * xf, axis=1) / h + eps)
    normed = (xf * inv[:, None]).to(x.dtype)
    w = tl.load(w_ptr + offs_h, mask=offs_h < h, other=0.0).to(x.dtype)
    y = (w[None, :].to(tl.float32) * normed.to(tl.float32)).to(x.dtype).to(tl.float32)
    _quant_store_rows(y, codes_ptr, scale_ptr, offs_r, offs_h, 0, rows, h, stride_codes, stride_sg,
                      POW2, BLOCK_R, BLOCK_H)  # fmt: skip


@triton.jit
def _silu_mul_quant_kernel(
    g_ptr, u_ptr, codes_ptr, scale_ptr, rows, k, stride_g, stride_u, stride_codes, stride_sg,
    POW2: tl.constexpr, BLOCK_R: tl.constexpr, GROUPS: tl.constexpr,
):  # fmt: skip
    offs_r = tl.program_id(1) * BLOCK_R + tl.arange(0, BLOCK_R)
    offs_k = tl.program_id(0) * (GROUPS * 128) + tl.arange(0, GROUPS * 128)
    mask = (offs_r < rows)[:, None] & (offs_k < k)[None, :]
    rows64 = offs_r.to(tl.int64)[:, None]
    g = tl.load(g_ptr + rows64 * stride_g + offs_k[None, :], mask=mask, other=0.0)
    u = tl.load(u_ptr + rows64 * stride_u + offs_k[None, :], mask=mask, other=0.0)
    gf = g.to(tl.float32)
    act = tl.math.div_rn(gf, 1.0 + tl.exp(-gf)).to(g.dtype)  # torch's silu, rounded once
    y = (act.to(tl.float32) * u.to(tl.float32)).to(g.dtype).to(tl.float32)
    _quant_store_rows(y, codes_ptr, scale_ptr, offs_r, offs_k, tl.program_id(0) * GROUPS, rows, k,
                      stride_codes, stride_sg, POW2, BLOCK_R, GROUPS * 128)  # fmt: skip


def _rows_2d(x: Tensor) -> Tensor:
    x2 = x.reshape(-1, x.shape[-1])
    return x2 if x2.stride(-1) == 1 else x2.contiguous()


def _outputs(rows: int, k: int, device: torch.device) -> tuple[Tensor, Tensor]:
    codes = torch.empty(rows, k, dtype=FP8_DTYPE, device=device)
    scale_storage = torch.empty(triton.cdiv(k, GROUP), rows, dtype=torch.float32, device=device)
    return codes, scale_storage


def _quantized(codes: Tensor, scale_storage: Tensor, lead: tuple[int, ...]) -> QuantizedTensor:
    k, groups = codes.shape[1], scale_storage.shape[0]
    return QuantizedTensor(codes.view(*lead, k), scale_storage.t().view(*lead, groups), (1, GROUP))


def add_rms_norm_quant_triton(
    x: Tensor, delta: Tensor | None, weight: Tensor, eps: float, *, scale_format: str = "fp32"
) -> tuple[Tensor, QuantizedTensor]:
    """``r = x + delta`` (or ``x``), then 1×128 quant of ``rms_norm(r, weight, eps)``.

    x, delta: ``[..., H]`` bfloat16/float32 (same dtype); weight ``[H]``. Returns ``(r, q)``:
    ``r`` the residual sum (``x`` itself when ``delta`` is None) and ``q`` the codes ``[..., H]`` +
    scales ``[..., ceil(H/128)]``. No finiteness check.
    """
    h = x.shape[-1]
    x2 = _rows_2d(x)
    rows = x2.shape[0]
    codes, scale_storage = _outputs(rows, h, x.device)
    if delta is None:
        d2, res = x2, x2
    else:
        d2 = _rows_2d(delta)
        res = torch.empty_like(x2)
    block_h = triton.next_power_of_2(max(h, GROUP))
    block_r = max(1, min(4, 8192 // block_h))
    if rows:
        _add_rms_norm_quant_kernel[(triton.cdiv(rows, block_r),)](
            x2, d2, res, weight, codes, scale_storage, rows, h, eps,
            x2.stride(0), d2.stride(0), res.stride(0), codes.stride(0), scale_storage.stride(0),
            HAS_DELTA=delta is not None, POW2=scale_format == "pow2", BLOCK_R=block_r,
            BLOCK_H=block_h, num_warps=4 if block_h <= 4096 else 8,
        )  # fmt: skip
    lead = tuple(x.shape[:-1])
    return res.view(*lead, h), _quantized(codes, scale_storage, lead)


def silu_mul_quant_triton(
    gate: Tensor, up: Tensor, *, scale_format: str = "fp32"
) -> QuantizedTensor:
    """1×128 quant of ``silu(gate) * up`` (``[..., I]`` each, any row stride; codes ``[..., I]``)."""
    k = gate.shape[-1]
    g2, u2 = gate.reshape(-1, k), up.reshape(-1, k)
    assert g2.stride(-1) == 1 and u2.stride(-1) == 1, "gate/up need unit stride on the last dim"
    rows = g2.shape[0]
    codes, scale_storage = _outputs(rows, k, gate.device)
    groups, block_r = 2, 16
    if rows:
        grid = (triton.cdiv(triton.cdiv(k, GROUP), groups), triton.cdiv(rows, block_r))
        _silu_mul_quant_kernel[grid](
            g2, u2, codes, scale_storage, rows, k, g2.stride(0), u2.stride(0), codes.stride(0),
            scale_storage.stride(0), POW2=scale_format == "pow2", BLOCK_R=block_r, GROUPS=groups,
            num_warps=4,
        )  # fmt: skip
    return _quantized(codes, scale_storage, tuple(gate.shape[:-1]))
