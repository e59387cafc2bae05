"""The exact (float64-accumulated) dense GEMM of a vocabulary-sized weight, a block of rows at a time.

``invariant.dense_linear(exact=True)`` computes ``F.linear(x.double(), w.double())`` rounded
once. For a tied lm_head (SmolLM2: 49152 × 576) that materialises the whole weight in float64
(226 MB) in every forward, and autograd's backward adds a float64 weight gradient of the same
size (plus its BF16 and FP32 roundings): about 0.6 GB of transient memory in the trainer's
backward pass, the largest single term of the quickstart's peak after the optimizer state.

``exact_dense_linear`` gives the same values with ``ROWS``-row blocks of the weight
(19 MB of float64 each):

* forward: each output column block is the float64 GEMM of the input with that block of
  rows — the same dot products over K as the one large GEMM, rounded once to x.dtype;
* backward: ∇W rows are independent (a sum over tokens, per block); ∇x is summed over the
  vocabulary in float64, block by block, and rounded once to x.dtype. That order differs from
  one large GEMM's by float64 ulps, far below one BF16 ulp (the argument of
  ``invariant``'s module docstring).

Gradients are returned in the dtypes autograd would give: ∇x in x.dtype, ∇W rounded through
x.dtype (the weight is used as its x.dtype copy, like ``dense_linear``) to the weight's dtype,
∇b likewise.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

ROWS = 4096
"""Weight rows per block (4096 × 576 × 8 bytes = 19 MB of float64 for SmolLM2)."""

MIN_ELEMENTS = 1 << 24
"""Weights with at least this many elements take the blocked path (vocabulary-sized heads);
smaller ones keep ``dense_linear``'s single GEMM."""

__all__ = ["MIN_ELEMENTS", "ROWS", "exact_dense_linear"]


def exact_dense_linear(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """y = x·Wᵀ + b accumulated in float64 and rounded once to x.dtype, ``ROWS`` rows of W at a
    time (forward and backward).

    Args:
        x: [..., K] activations (BF16 or FP32). weight: [N, K] (any float dtype; used as its
            x.dtype copy). bias: [N] or None.
    Returns:
        [..., N] in x.dtype.
    """
    return _BlockedExactDense.apply(x, weight, bias)


def _rows_double(t: Tensor, start: int, dtype: torch.dtype) -> Tensor:
    return t[start : start + ROWS].to(dtype).double()


class _BlockedExactDense(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
        x64 = x.double()
        out = torch.empty(*x.shape[:-1], weight.shape[0], dtype=x.dtype, device=x.device)
        for start in range(0, weight.shape[0], ROWS):
            w = _rows_double(weight, start, x.dtype)
            b = None if bias is None else _rows_double(bias, start, x.dtype)
            out[..., start : start + w.shape[0]] = F.linear(x64, w, b).to(x.dtype)
        ctx.save_for_backward(x, weight, bias)
        return out

    @staticmethod
    def backward(ctx, grad_out: Tensor):
        x, weight, bias = ctx.saved_tensors
        need_x, need_w, need_b = ctx.needs_input_grad
        g64 = grad_out.reshape(-1, grad_out.shape[-1]).double()
        x64 = x.reshape(-1, x.shape[-1]).double()
        grad_x64 = torch.zeros_like(x64) if need_x else None
        grad_w = torch.empty_like(weight) if need_w else None
        grad_b = torch.empty_like(bias) if need_b else None
        for start in range(0, weight.shape[0], ROWS):
            g = g64[:, start : start + ROWS]
            if need_x:
                grad_x64 += g @ _rows_double(weight, start, x.dtype)
            if need_w:
                grad_w[start : start + g.shape[1]] = (g.t() @ x64).to(x.dtype).to(weight.dtype)
            if need_b:
                grad_b[start : start + g.shape[1]] = g.sum(0).to(x.dtype).to(bias.dtype)
        grad_x = grad_x64.to(x.dtype).reshape(x.shape) if need_x else None
        return grad_x, grad_w, grad_b
