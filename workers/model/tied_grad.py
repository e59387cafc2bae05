"""The tied embedding / lm_head weight's gradient, summed in the embedding's backward.

A tied weight W (SmolLM2: 49152 × 576) is used twice: by the embedding at the start of the
forward and by the vocabulary head at its end. Autograd keeps the head's ∇W (the whole [V, H]
FP32, 113 MB) in the input buffer of W's accumulation node from the head's backward until the
embedding's, i.e. through the whole decoder backward, and the embedding's backward then adds a
second dense [V, H] gradient. Both were the largest transients of the quickstart trainer's peak
(issue 18).

Here the head (exact blocked path, ``dense_exact.DeferredWeightGrad``) keeps only its output
gradient and input, and ``tied_embedding``'s backward returns the whole ∇W:

    ∇W = (head₁ + head₂ + …) + E,   E = the embedding's dense gradient

with the same additions in the same order as autograd's input buffer (head calls in the order
their backward ran, then E), so W's gradient is bitwise the same. E is formed on the rows of the
micro-batch's distinct tokens only (``aten.embedding_backward`` on the remapped ids: the same
per-row sums in the same order); every other row gets ``head + 0`` as the dense E would give it.
"""

from __future__ import annotations

import torch
from torch import Tensor

from fp8rl.kernels.dense_exact import MIN_ELEMENTS, DeferredWeightGrad

__all__ = ["defers_head_grad", "tied_embedding"]


def defers_head_grad(weight: Tensor, *, exact: bool) -> bool:
    """Whether a tied head on ``weight`` takes ``dense_linear``'s blocked exact path (the one
    that can defer ∇W) in a pass that builds a graph: exact, vocabulary-sized, CPU, trainable."""
    return (
        exact
        and weight.numel() >= MIN_ELEMENTS
        and weight.device.type == "cpu"
        and weight.requires_grad
        and torch.is_grad_enabled()
    )


def tied_embedding(ids: Tensor, weight: Tensor, head: DeferredWeightGrad) -> Tensor:
    """``F.embedding(ids, weight)`` whose backward also returns the deferred head gradients.

    Args:
        ids: [...] int64 token ids. weight: [V, H] tied embedding / head weight.
        head: the holder the head's ``dense_linear(..., deferred=head)`` calls fill.
    Returns:
        [..., H] rows of ``weight`` (its dtype).
    """
    return _TiedEmbedding.apply(ids, weight, head)


class _TiedEmbedding(torch.autograd.Function):
    @staticmethod
    def forward(ctx, ids: Tensor, weight: Tensor, head: DeferredWeightGrad) -> Tensor:
        ctx.save_for_backward(ids)
        ctx.weight, ctx.head = weight, head  # a parameter: alive anyway; only its shape is read
        return torch.nn.functional.embedding(ids, weight)

    @staticmethod
    def backward(ctx, grad_out: Tensor):
        (ids,) = ctx.saved_tensors
        total = ctx.head.total(ctx.weight)
        if total is None:  # the head took a path that returns its ∇W to autograd itself
            vocab = ctx.weight.shape[0]
            dense = torch.ops.aten.embedding_backward(grad_out, ids, vocab, -1, False, False)
            return None, dense, None
        rows, inverse = torch.unique(ids.reshape(-1), return_inverse=True)
        e_rows = torch.ops.aten.embedding_backward(
            grad_out, inverse.reshape(ids.shape), rows.shape[0], -1, False, False
        )
        hit = total[rows] + e_rows  # head + E on the rows the micro-batch's tokens touch
        total.add_(0.0)  # head + 0 elsewhere (−0 becomes +0, as adding E's zero rows does)
        total[rows] = hit
        return None, total, None
