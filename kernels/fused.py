"""Fused elementwise → 1×128 FP8 quantization for the fast inference path (issue 14).

``add_rms_norm_quant`` and ``silu_mul_quant`` return what the unfused composition
``per_token_group_quant(rms_norm(x + delta))`` / ``per_token_group_quant(silu_mul(g, u))``
returns, in one kernel on CUDA (``fused_triton``) and as that very composition elsewhere (the
pure-torch reference, the CPU truth). On the GPU the fast path's unfused ops are
``rms_norm_fast`` / ``silu_mul_fast`` (the same kernels without the quant step), so the fused codes
are bitwise ``per_token_group_quant`` of what the trainer's forward computes; they differ from
the torch references only by the mean-square summation order and ``exp``'s rounding. Exact mode
runs them too on CUDA in BF16/FP16, where its trainer's norm and SiLU are this same arithmetic
(``invariant.rms_norm``/``silu_mul``); elsewhere its norm and SiLU are float64 and its engine
runs the unfused ops.
"""

from __future__ import annotations

import torch
from torch import Tensor

from fp8rl.kernels.finite import raise_if_not_finite, should_check_finite
from fp8rl.kernels.quant import (
    QuantizedTensor,
    ScaleFormat,
    per_token_group_quant_reference,
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
    y = rms_norm_reference(res, weight, eps)
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


# ---------------------------------------------------------------------------------------------
# The same values without the quantization, with autograd: the fast path's unfused ops on CUDA.


def rms_norm_reference(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    """RMSNorm with torch ops (float32 statistics, rounding to ``x.dtype``; [..., H] → [..., H])."""
    h = x.float()
    normed = (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)
    return weight.to(x.dtype) * normed


_TRITON_BACKWARD = [True]
"""Whether the fast RMSNorm / SwiGLU backward runs ``fused_backward_triton`` (see
``set_triton_backward``)."""


def set_triton_backward(on: bool) -> bool:
    """Run the backward of ``rms_norm_fast`` / ``silu_mul_fast`` with the one-pass Triton kernels
    of ``fused_backward_triton`` (True, the default since 2026-12-04) or, as before, by
    differentiating the recomputed torch composition (False; for A/B benchmarks). Process-wide;
    returns the previous setting. Forward values never change."""
    previous, _TRITON_BACKWARD[0] = _TRITON_BACKWARD[0], bool(on)
    return previous


class _RmsNormFast(torch.autograd.Function):
    """Forward: the Triton kernel of the fused norm-quant (bitwise its values). Backward: the
    one-pass Triton kernel of ``fused_backward_triton``, or the gradient of the recomputed torch
    composition (``set_triton_backward(False)``; mathematically the same function)."""

    @staticmethod
    def forward(ctx, x: Tensor, weight: Tensor, eps: float) -> Tensor:
        from fp8rl.kernels import fused_triton

        ctx.save_for_backward(x, weight)
        ctx.eps = eps
        return fused_triton.rms_norm_triton(x, weight, eps)

    @staticmethod
    def backward(ctx, grad: Tensor):
        x, weight = ctx.saved_tensors
        if _TRITON_BACKWARD[0]:
            from fp8rl.kernels.fused_backward_triton import rms_norm_backward

            return (*rms_norm_backward(x, weight, grad, ctx.eps), None)
        with torch.enable_grad():
            x_, w_ = x.detach().requires_grad_(), weight.detach().requires_grad_()
            y = rms_norm_reference(x_, w_, ctx.eps)
            gx, gw = torch.autograd.grad(y, (x_, w_), grad)
        return gx, gw, None


class _SiluMulFast(torch.autograd.Function):
    """Forward: the Triton kernel of the fused SwiGLU-quant (bitwise its values). Backward: the
    one-pass Triton kernel of ``fused_backward_triton``, or the gradient of ``silu(gate) * up``
    recomputed with torch ops (``set_triton_backward(False)``)."""

    @staticmethod
    def forward(ctx, gate: Tensor, up: Tensor) -> Tensor:
        from fp8rl.kernels import fused_triton

        ctx.save_for_backward(gate, up)
        return fused_triton.silu_mul_triton(gate, up)

    @staticmethod
    def backward(ctx, grad: Tensor):
        gate, up = ctx.saved_tensors
        if _TRITON_BACKWARD[0]:
            from fp8rl.kernels.fused_backward_triton import silu_mul_backward

            return silu_mul_backward(gate, up, grad)
        with torch.enable_grad():
            g_, u_ = gate.detach().requires_grad_(), up.detach().requires_grad_()
            y = torch.nn.functional.silu(g_) * u_
            return torch.autograd.grad(y, (g_, u_), grad)


def rms_norm_fast(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    """Fast-mode RMSNorm whose values are bitwise what ``add_rms_norm_quant`` quantizes.

    Args:
        x: ``[..., H]`` bfloat16/float32 activations. weight: ``[H]`` gain (cast to x.dtype).
        eps: added to the mean square.
    Returns:
        ``[..., H]`` in x.dtype. On CUDA with Triton: the fused norm kernel without its quant
        step (mean square summed in float64, rounded once to float32), with autograd; elsewhere
        ``rms_norm_reference``. So the trainer's FP8 FProp input (quantized by
        ``per_token_group_quant``) has the codes the fused rollout path computes (Jet-RL §3).
    """
    if _use_triton(x):
        return _RmsNormFast.apply(x, weight, eps)
    return rms_norm_reference(x, weight, eps)


def silu_mul_fast(gate: Tensor, up: Tensor) -> Tensor:
    """Fast-mode ``silu(gate) * up`` whose values are bitwise what ``silu_mul_quant`` quantizes.

    Args:
        gate, up: ``[..., I]`` bfloat16/float32, same shape.
    Returns:
        ``[..., I]`` in gate's dtype: the fused kernel without its quant step on CUDA with Triton
        (with autograd), ``F.silu(gate) * up`` elsewhere.
    Raises:
        ValueError: shapes differ.
    """
    if gate.shape != up.shape:
        raise ValueError(f"silu_mul_fast: gate {tuple(gate.shape)} != up {tuple(up.shape)}")
    if _use_triton(gate):
        return _SiluMulFast.apply(gate, up)
    return torch.nn.functional.silu(gate) * up
