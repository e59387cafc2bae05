"""Fused elementwise → 1×128 FP8 quantization for the fast inference path (issue 14).

``add_rms_norm_quant`` and ``silu_mul_quant`` return what the unfused composition
``per_token_group_quant(rms_norm(x + delta))`` / ``per_token_group_quant(silu_mul(g, u))``
returns, in one kernel on CUDA (``fused_triton``) and as that very composition elsewhere (the
pure-torch reference, the CPU truth). See ``fused_triton`` for what may differ on the GPU (the
order of the mean-square reduction). Exact mode does not use these: its norm is float64.
"""

from __future__ import annotations

import torch
from torch import Tensor

from fp8rl.kernels.quant import (
    QuantizedTensor,
    ScaleFormat,
    per_token_group_quant_reference,
    raise_if_not_finite,
    should_check_finite,
)


def _use_triton(x: Tensor) -> bool:
    from fp8rl.kernels.backend import triton_available

    return x.is_cuda and triton_available()


def add_rms_norm_quant_reference(
    x: Tensor,
    delta: Tensor | None,
    weight: Tensor,
    eps: float,
    *,
    scale_format: ScaleFormat = "fp32",
) -> tuple[Tensor, QuantizedTensor]:
    """The unfused composition (torch ops, float32 statistics, rounding to ``x.dtype`` like
    ``invariant.rms_norm(exact=False)``). Shapes as ``add_rms_norm_quant``."""
    res = x if delta is None else x + delta
    h = res.float()
    normed = (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)
    y = weight.to(x.dtype) * normed
    return res, per_token_group_quant_reference(y, scale_format=scale_format, check_finite=False)


def add_rms_norm_quant(
    x: Tensor,
    delta: Tensor | None,
    weight: Tensor,
    eps: float,
    *,
    scale_format: ScaleFormat = "fp32",
    check_finite: bool = False,
) -> tuple[Tensor, QuantizedTensor]:
    """Residual add + RMSNorm + 1×128 FP8 quantization in one pass.

    Args:
        x: ``[..., H]`` bfloat16/float32 residual stream.
        delta: ``[..., H]`` (same dtype) added to ``x`` first, or None.
        weight: ``[H]`` RMSNorm gain (cast to ``x.dtype``, Llama/HF convention).
        eps: added to the mean square.
        scale_format: ``"fp32"`` or ``"pow2"`` activation scale rule.
        check_finite: raise ``ValueError`` when a group is NaN/inf (one host sync on CUDA).
    Returns:
        ``(residual [..., H] x.dtype, QuantizedTensor codes [..., H], scale [..., ceil(H/128)])``.
    Source: Zhang & Sennrich 2019 (RMSNorm), DeepSeek-V3 §3.3 (1×128 activation groups).
    """
    if x.shape[-1] != weight.shape[-1] or (delta is not None and delta.shape != x.shape):
        raise ValueError(
            f"add_rms_norm_quant: x {tuple(x.shape)}, delta "
            f"{None if delta is None else tuple(delta.shape)}, weight {tuple(weight.shape)}"
        )
    if _use_triton(x):
        from fp8rl.kernels import fused_triton

        res, q = fused_triton.add_rms_norm_quant_triton(
            x, delta, weight, eps, scale_format=scale_format
        )
    else:
        res, q = add_rms_norm_quant_reference(x, delta, weight, eps, scale_format=scale_format)
    if should_check_finite(check_finite, x.device):
        raise_if_not_finite(q.scale, name="normed activation", what="a 1x128 row group")
    return res, q


def silu_mul_quant_reference(
    gate: Tensor, up: Tensor, *, scale_format: ScaleFormat = "fp32"
) -> QuantizedTensor:
    """The unfused composition ``per_token_group_quant(silu(gate) * up)`` (torch ops)."""
    y = torch.nn.functional.silu(gate) * up
    return per_token_group_quant_reference(y, scale_format=scale_format, check_finite=False)


def silu_mul_quant(
    gate: Tensor, up: Tensor, *, scale_format: ScaleFormat = "fp32", check_finite: bool = False
) -> QuantizedTensor:
    """SwiGLU's ``silu(gate) * up`` quantized 1×128, in one pass.

    Args:
        gate, up: ``[..., I]`` bfloat16/float32 (views with unit last-dim stride are fine, e.g.
            the two halves of a fused gate/up GEMM output).
        scale_format, check_finite: as ``add_rms_norm_quant``.
    Returns:
        ``QuantizedTensor`` codes ``[..., I]``, scale ``[..., ceil(I/128)]``, block (1,128).
    Source: Shazeer 2020 (GLU variants), DeepSeek-V3 §3.3.
    """
    if gate.shape != up.shape:
        raise ValueError(f"silu_mul_quant: gate {tuple(gate.shape)} != up {tuple(up.shape)}")
    if _use_triton(gate):
        from fp8rl.kernels import fused_triton

        q = fused_triton.silu_mul_quant_triton(gate, up, scale_format=scale_format)
    else:
        q = silu_mul_quant_reference(gate, up, scale_format=scale_format)
    if should_check_finite(check_finite, gate.device):
        raise_if_not_finite(q.scale, name="SwiGLU activation", what="a 1x128 row group")
    return q
