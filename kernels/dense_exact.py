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

**Deferred ∇W (a tied head).** With ``deferred=DeferredWeightGrad()`` the backward returns no
∇W: it keeps the call's output gradient and input (a few response tokens' worth) and
``DeferredWeightGrad.total`` computes ∇W later with the same arithmetic. The tied embedding's
backward (``workers/model/tied_grad.py``) calls it, so the vocabulary-sized ∇W of the head is
not held in autograd's input buffer for the tied weight during the whole decoder backward
(113 MB for SmolLM2, issue 18's quickstart memory).
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

__all__ = ["MIN_ELEMENTS", "ROWS", "DeferredWeightGrad", "exact_dense_linear"]


class DeferredWeightGrad:
    """The weight gradients of ``exact_dense_linear`` calls, computed when asked instead of in
    their backward (the tied embedding's backward asks; see the module docstring).

    The calls' contributions are summed in the order their backward ran, first one first: the
    order in which autograd's input buffer would have summed the gradients they return.
    """

    def __init__(self) -> None:
        self._pending: list[tuple[Tensor, Tensor]] = []
        self._closed = False

    def add(self, grad_out: Tensor, x: Tensor) -> None:
        """Keep one call's output gradient [..., N] and input [..., K] for ``total``.

        Raises:
            RuntimeError: ``total`` already ran (a backward reached the head after the embedding:
                its gradient would be lost).
        """
        if self._closed:
            raise RuntimeError("a deferred lm_head weight gradient arrived after it was summed")
        self._pending.append((grad_out, x))

    def total(self, weight: Tensor) -> Tensor | None:
        """∇W [N, K] in weight.dtype: the sum of the kept calls' gradients (None if none ran).
        Closes the holder."""
        self._closed = True
        out = None
        for grad_out, x in self._pending:
            g = _weight_grad(grad_out, x, weight)
            out = g if out is None else out.add_(g)
        self._pending.clear()
        return out


def exact_dense_linear(
    x: Tensor,
    weight: Tensor,
    bias: Tensor | None = None,
    *,
    deferred: DeferredWeightGrad | None = None,
) -> Tensor:
    """y = x·Wᵀ + b accumulated in float64 and rounded once to x.dtype, ``ROWS`` rows of W at a
    time (forward and backward).

    Args:
        x: [..., K] activations (BF16 or FP32). weight: [N, K] (any float dtype; used as its
            x.dtype copy). bias: [N] or None.
        deferred: keep ∇W for ``deferred.total`` instead of returning it (a tied head whose
            embedding's backward sums it); None: autograd gets ∇W as usual.
    Returns:
        [..., N] in x.dtype.
    """
    return _BlockedExactDense.apply(x, weight, bias, deferred)


def _weight_grad(grad_out: Tensor, x: Tensor, weight: Tensor) -> Tensor:
    """∇W [N, K] of y = x·Wᵀ from grad_out [..., N] and x [..., K]: float64 per ``ROWS`` block,
    rounded through x.dtype to weight.dtype."""
    g64 = grad_out.reshape(-1, grad_out.shape[-1]).double()
    x64 = x.reshape(-1, x.shape[-1]).double()
    grad_w = torch.empty_like(weight)
    for start in range(0, weight.shape[0], ROWS):
        g = g64[:, start : start + ROWS]
        grad_w[start : start + g.shape[1]] = (g.t() @ x64).to(x.dtype).to(weight.dtype)
    return grad_w


def _rows_double(t: Tensor, start: int, dtype: torch.dtype) -> Tensor:
    return t[start : start + ROWS].to(dtype).double()


class _BlockedExactDense(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx, x: Tensor, weight: Tensor, bias: Tensor | None, deferred: DeferredWeightGrad | None
    ) -> Tensor:
        x64 = x.double()
        out = torch.empty(*x.shape[:-1], weight.shape[0], dtype=x.dtype, device=x.device)
        for start in range(0, weight.shape[0], ROWS):
            w = _rows_double(weight, start, x.dtype)
            b = None if bias is None else _rows_double(bias, start, x.dtype)
            out[..., start : start + w.shape[0]] = F.linear(x64, w, b).to(x.dtype)
        ctx.save_for_backward(x, weight, bias)
        ctx.deferred = deferred
        return out

    @staticmethod
    def backward(ctx, grad_out: Tensor):
        x, weight, bias = ctx.saved_tensors
        need_x, need_w, need_b = ctx.needs_input_grad[:3]
        grad_w = None
        if need_w and ctx.deferred is not None:
            ctx.deferred.add(grad_out, x)
        elif need_w:
            grad_w = _weight_grad(grad_out, x, weight)
        g64 = grad_out.reshape(-1, grad_out.shape[-1]).double()
        grad_x64 = None
        if need_x:
            grad_x64 = torch.zeros(g64.shape[0], x.shape[-1], dtype=torch.float64, device=x.device)
        grad_b = torch.empty_like(bias) if need_b else None
        for start in range(0, weight.shape[0], ROWS):
            g = g64[:, start : start + ROWS]
            if need_x:
                grad_x64 += g @ _rows_double(weight, start, x.dtype)
            if need_b:
                grad_b[start : start + g.shape[1]] = g.sum(0).to(x.dtype).to(bias.dtype)
        grad_x = grad_x64.to(x.dtype).reshape(x.shape) if need_x else None
        return grad_x, grad_w, grad_b, None
