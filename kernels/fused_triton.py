"""Triton kernels that fuse the fast path's elementwise ops with the 1×128 FP8 activation quant.

Design notes
------------
* Decode is memory- and launch-bound: every unfused op is a kernel launch and a round trip of
  the activation through HBM. Two fusions cover the quantizer inputs of a decoder block:
  ``add_rms_norm_quant`` (residual add → RMSNorm → 1×128 quant, one row read once) feeds the
  fused q/k/v and gate/up GEMMs, ``silu_mul_quant`` (SiLU(gate)·up → 1×128 quant) feeds down_proj.
* **Engine and trainer compute the same values** (Jet-RL: one quantization on both sides). The
  fast path's unfused ops on CUDA, ``invariant.rms_norm`` / ``invariant.silu_mul`` with
  ``exact=False`` (what the trainer's forward runs), are the no-quant kernels of this module
  (``rms_norm_triton``, ``silu_mul_triton``), built from the same ``@triton.jit`` helpers
  (``_normed_rows``, ``_silu_mul_rounded``) as the fused ones. The quant step is
  ``quant_triton``'s (same ``_scale_from_amax``/``_to_codes``), so the fused codes are bitwise
  ``per_token_group_quant`` of the trainer's normed / SwiGLU activation. Before this, the fused
  kernels differed from the torch ops in the mean-square reduction order and in ``exp``, and the
  fast-mode token_mult_prob_error on small-llama went from 1.0245 to 1.0346.
* The rounding follows torch's ops: the residual sum and the normalised row are rounded to the
  activation dtype, the gain multiply is done in that dtype, SiLU and the product are rounded to
  it. The mean square is summed in float64 and rounded once to float32, so it does not depend on
  how a compiled kernel distributes a row over threads (two float64 summation orders round to the
  same float32 except within ~1e-16 of a float32 rounding boundary). Exact mode's trainer runs
  the unfused ones on CUDA (``invariant.rms_norm``/``silu_mul``) and its engine these fused ones
  (BF16/FP16; ``Block.fused_ready``), for the same reasons; on CPU it keeps the float64
  invariant ops.
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
def _normed_rows(x, w_ptr, offs_h, h, eps):
    """``weight * rms_norm(x)`` of a ``[BLOCK_R, BLOCK_H]`` tile in x's dtype, as float32 values
    (mean square summed in float64, rounded once to float32; masked columns must be 0)."""
    xf = x.to(tl.float32)
    x64 = xf.to(tl.float64)
    mean_sq = (tl.sum(x64 * x64, axis=1) / h).to(tl.float32)
    inv = tl.math.rsqrt(mean_sq + eps)
    normed = (xf * inv[:, None]).to(x.dtype)
    w = tl.load(w_ptr + offs_h, mask=offs_h < h, other=0.0).to(x.dtype)
    return (w[None, :].to(tl.float32) * normed.to(tl.float32)).to(x.dtype).to(tl.float32)


@triton.jit
def _add_rms_norm_quant_kernel(
    x_ptr, d_ptr, res_ptr, w_ptr, out_ptr, scale_ptr, rows, h, eps,
    stride_x, stride_d, stride_res, stride_out, stride_sg,
    HAS_DELTA: tl.constexpr, QUANT: tl.constexpr, POW2: tl.constexpr, BLOCK_R: tl.constexpr,
    BLOCK_H: tl.constexpr,
):  # fmt: skip
    """QUANT: codes + scales to ``out_ptr``/``scale_ptr``; else the normed row to ``out_ptr``."""
    offs_r = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    offs_h = tl.arange(0, BLOCK_H)
    mask = (offs_r < rows)[:, None] & (offs_h < h)[None, :]
    rows64 = offs_r.to(tl.int64)[:, None]
    x = tl.load(x_ptr + rows64 * stride_x + offs_h[None, :], mask=mask, other=0.0)
    if HAS_DELTA:  # residual add, rounded to the activation dtype like torch's x + delta
        d = tl.load(d_ptr + rows64 * stride_d + offs_h[None, :], mask=mask, other=0.0)
        x = (x.to(tl.float32) + d.to(tl.float32)).to(x.dtype)
        tl.store(res_ptr + rows64 * stride_res + offs_h[None, :], x, mask=mask)
    y = _normed_rows(x, w_ptr, offs_h, h, eps)
    if QUANT:
        _quant_store_rows(y, out_ptr, scale_ptr, offs_r, offs_h, 0, rows, h, stride_out,
                          stride_sg, POW2, BLOCK_R, BLOCK_H)  # fmt: skip
    else:
        tl.store(out_ptr + rows64 * stride_out + offs_h[None, :], y.to(x.dtype), mask=mask)


@triton.jit
def _silu_mul_rounded(g, u):
    """``silu(g) * u`` in g's dtype (SiLU and the product each rounded once, like torch's ops;
    ``exp`` is Triton's), as float32 values."""
    gf = g.to(tl.float32)
    act = tl.math.div_rn(gf, 1.0 + tl.exp(-gf)).to(g.dtype)
    return (act.to(tl.float32) * u.to(tl.float32)).to(g.dtype).to(tl.float32)


@triton.jit
def _silu_mul_quant_kernel(
    g_ptr, u_ptr, out_ptr, scale_ptr, rows, k, stride_g, stride_u, stride_out, stride_sg,
    QUANT: tl.constexpr, POW2: tl.constexpr, BLOCK_R: tl.constexpr, GROUPS: tl.constexpr,
):  # fmt: skip
    """QUANT: codes + scales to ``out_ptr``/``scale_ptr``; else ``silu(g) * u`` to ``out_ptr``."""
    offs_r = tl.program_id(1) * BLOCK_R + tl.arange(0, BLOCK_R)
    offs_k = tl.program_id(0) * (GROUPS * 128) + tl.arange(0, GROUPS * 128)
    mask = (offs_r < rows)[:, None] & (offs_k < k)[None, :]
    rows64 = offs_r.to(tl.int64)[:, None]
    g = tl.load(g_ptr + rows64 * stride_g + offs_k[None, :], mask=mask, other=0.0)
    u = tl.load(u_ptr + rows64 * stride_u + offs_k[None, :], mask=mask, other=0.0)
    y = _silu_mul_rounded(g, u)
    if QUANT:
        _quant_store_rows(y, out_ptr, scale_ptr, offs_r, offs_k, tl.program_id(0) * GROUPS, rows,
                          k, stride_out, stride_sg, POW2, BLOCK_R, GROUPS * 128)  # fmt: skip
    else:
        tl.store(out_ptr + rows64 * stride_out + offs_k[None, :], y.to(g.dtype), mask=mask)


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
    if rows:
        _add_rms_norm_quant_kernel[(triton.cdiv(rows, _norm_launch(h)["BLOCK_R"]),)](
            x2, d2, res, weight.contiguous(), codes, scale_storage, rows, h, eps,
            x2.stride(0), d2.stride(0), res.stride(0), codes.stride(0), scale_storage.stride(0),
            HAS_DELTA=delta is not None, QUANT=True, POW2=scale_format == "pow2",
            **_norm_launch(h),
        )  # fmt: skip
    lead = tuple(x.shape[:-1])
    return res.view(*lead, h), _quantized(codes, scale_storage, lead)


def _norm_launch(h: int) -> dict[str, int]:
    """Tile and warps of the norm kernels: a function of H only, so the fused and unfused
    kernels (and every batch size) compile the same reduction."""
    block_h = triton.next_power_of_2(max(h, GROUP))
    return {
        "BLOCK_R": max(1, min(4, 8192 // block_h)),
        "BLOCK_H": block_h,
        "num_warps": 4 if block_h <= 4096 else 8,
    }


def rms_norm_triton(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    """``rms_norm(x, weight, eps)`` (``[..., H]`` → ``[..., H]`` in x.dtype), the values
    ``add_rms_norm_quant_triton`` quantizes, bitwise. No autograd (see ``fused.rms_norm_fast``)."""
    h = x.shape[-1]
    x2 = _rows_2d(x)
    rows = x2.shape[0]
    out = torch.empty_like(x2)
    launch = _norm_launch(h)
    if rows:
        _add_rms_norm_quant_kernel[(triton.cdiv(rows, launch["BLOCK_R"]),)](
            x2, x2, x2, weight.contiguous(), out, out, rows, h, eps,
            x2.stride(0), x2.stride(0), x2.stride(0), out.stride(0), 0,
            HAS_DELTA=False, QUANT=False, POW2=False, **launch,
        )  # fmt: skip
    return out.view(x.shape)


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
            scale_storage.stride(0), QUANT=True, POW2=scale_format == "pow2", BLOCK_R=block_r,
            GROUPS=groups, num_warps=4,
        )  # fmt: skip
    return _quantized(codes, scale_storage, tuple(gate.shape[:-1]))


def silu_mul_triton(gate: Tensor, up: Tensor) -> Tensor:
    """``silu(gate) * up`` (``[..., I]`` each → ``[..., I]`` in gate's dtype), the values
    ``silu_mul_quant_triton`` quantizes, bitwise. No autograd (see ``fused.silu_mul_fast``)."""
    k = gate.shape[-1]
    g2, u2 = _rows_2d(gate), _rows_2d(up)
    rows = g2.shape[0]
    out = torch.empty(rows, k, dtype=gate.dtype, device=gate.device)
    groups, block_r = 2, 16
    if rows:
        grid = (triton.cdiv(triton.cdiv(k, GROUP), groups), triton.cdiv(rows, block_r))
        _silu_mul_quant_kernel[grid](
            g2, u2, out, out, rows, k, g2.stride(0), u2.stride(0), out.stride(0), 0,
            QUANT=False, POW2=False, BLOCK_R=block_r, GROUPS=groups, num_warps=4,
        )  # fmt: skip
    return out.view(gate.shape)
