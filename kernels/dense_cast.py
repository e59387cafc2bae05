"""A dense layer's weight cast to the compute dtype once for several GEMMs (the chunked lm_head).

``invariant.dense_linear`` casts an FP32 master weight to the activation dtype on every call, so
the trainer computes what a rollout engine holding the BF16 copy computes. ``chunked_logprobs``
calls the vocabulary head once per chunk of tokens and again in each chunk's recompute: at 16K
tokens in 2,048-token chunks, Llama-3.1-8B's 128,256 × 4,096 head is cast 16 times a step, 3.2 GB
moved each time (~50 GB, ~12 ms of HBM time on an H200), and autograd casts each chunk's BF16 ∇W
back to FP32 once more (``ToCopyBackward``).

``cast_weight`` makes the copy once per scoring pass; ``cast_linear`` runs the GEMM on it and
returns ∇W to the master weight in the master's dtype, through the same operations autograd runs
for ``F.linear(x, weight.to(dtype), bias)`` (``MmBackward``'s ∇ of a transposed weight, then the
cast), so outputs and gradients are bitwise the uncached path's
(``tests/model/test_dense_cast.py``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor


def cast_weight(weight: Tensor, dtype: torch.dtype) -> Tensor | None:
    """``weight`` detached and cast to ``dtype`` (one copy), or None when it already is ``dtype``
    (then casting is free and there is nothing to keep).

    Args:
        weight: [N, K] master weight (e.g. FP32). dtype: the compute dtype (e.g. BF16).
    Returns:
        [N, K] in ``dtype`` without autograd history, or None. Valid until ``weight`` changes (an
        optimizer step): callers keep it for one forward pass and its backward only.
    """
    if weight.dtype == dtype:
        return None
    with torch.no_grad():
        return weight.detach().to(dtype)


class _CastLinear(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: Tensor, weight: Tensor, cast: Tensor, bias: Tensor | None) -> Tensor:
        ctx.save_for_backward(x, cast)
        ctx.w_dtype = weight.dtype
        ctx.b_dtype = None if bias is None else bias.dtype
        return F.linear(x, cast, None if bias is None else bias.to(x.dtype))

    @staticmethod
    def backward(ctx, grad_y: Tensor):
        x, cast = ctx.saved_tensors
        need_x, need_w, _, need_b = ctx.needs_input_grad
        g2 = grad_y.reshape(-1, grad_y.shape[-1])
        grad_x = grad_w = grad_b = None
        if need_x:
            grad_x = g2.mm(cast).reshape(x.shape)
        if need_w:  # MmBackward's ∇ of the column-major Wᵀ: (∇Yᵀ·X), then the cast's backward
            grad_w = g2.t().mm(x.reshape(-1, x.shape[-1])).to(ctx.w_dtype)
        if need_b and ctx.b_dtype is not None:
            grad_b = g2.sum(0).to(ctx.b_dtype)
        return grad_x, grad_w, None, grad_b


def cast_linear(x: Tensor, weight: Tensor, cast: Tensor, bias: Tensor | None = None) -> Tensor:
    """``y = x · castᵀ (+ bias)`` with ∇W returned to ``weight`` (fast, non-exact path).

    Args:
        x: [..., K] activations in the compute dtype.
        weight: [N, K] master weight (receives ∇W in its own dtype).
        cast: ``cast_weight(weight, x.dtype)``: [N, K] in x.dtype, no autograd history.
        bias: optional [N] (added in x.dtype).
    Returns:
        [..., N] in x.dtype; bitwise ``F.linear(x, weight.to(x.dtype), bias)`` with the same
        gradients for x, weight and bias.
    Raises:
        ValueError: ``cast`` is not ``weight``'s shape in x.dtype.
    """
    if cast.shape != weight.shape or cast.dtype != x.dtype:
        raise ValueError(
            f"cast {tuple(cast.shape)} {cast.dtype} is not weight {tuple(weight.shape)} in "
            f"{x.dtype}: make it with cast_weight(weight, x.dtype)"
        )
    if not torch.is_grad_enabled():
        return F.linear(x, cast, None if bias is None else bias.to(x.dtype))
    return _CastLinear.apply(x, weight, cast, bias)
