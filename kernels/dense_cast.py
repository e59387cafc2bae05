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

``GradSum`` removes the other per-chunk cost: each chunk's ∇W used to be a BF16 GEMM output,
cast to FP32 (3.2 GB moved per chunk) and added by autograd to the running ∇W (6.3 GB per
chunk): ~20 ms of a 16K-token Llama-3.1-8B step on an H200 (8 chunks; 2026-12-05 profile:
18.8 ms of copies, 13.8 ms of FP32 adds, mostly these). With it, on CUDA every chunk's GEMM
writes FP32 and accumulates into one buffer (cuBLAS β = 1; one rounding per chunk to FP32 instead
of one to BF16 and one add), and autograd receives the sum once, through ``GradSum.collect``.
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


class GradSum:
    """∇W of the calls of one scoring pass on one weight, summed in one buffer.

    The calls are ``cast_linear`` (fast path) and ``dense_exact_triton.exact_dense_gemm`` (exact
    path on CUDA), reached through ``invariant.dense_linear(..., grad_sum=)``. Usage:
    ``grad_sum = GradSum(weight)``; ``x = grad_sum.collect(x)`` once, before the calls (an
    identity whose backward runs after every call's: their outputs all depend on it); then the
    calls on slices of that ``x``. The calls return no ∇W to autograd; the identity's backward
    returns their sum as ``weight``'s gradient (one ``AccumulateGrad``, so hooks and FSDP see one
    gradient as usual). One pass per ``GradSum``; a backward that stops before the identity's
    (``autograd.grad`` of other inputs) leaves nothing behind for the next one: sums are kept per
    backward pass (autograd's graph task).

    The sum: on CUDA with BF16/FP16 inputs and an FP32 weight, each call's ∇Yᵀ·X is one GEMM with
    FP32 output accumulating into the buffer (``torch.addmm(..., out_dtype=float32)``); more
    accurate than a per-call BF16 ∇W (no BF16 rounding per call), not bitwise it. Elsewhere (and
    under ``create_graph``), each call's product in x.dtype is cast to the weight's dtype and
    added in call order: bitwise what autograd's accumulation of the per-call gradients gives.
    """

    def __init__(self, weight: Tensor) -> None:
        self.weight = weight
        self.total: Tensor | None = None
        self._task: int | None = None  # the backward pass (graph task) ``total`` belongs to
        self._node = None  # the collect output's grad_fn: the calls' inputs must descend from it
        self._collected = False

    def collect(self, x: Tensor) -> Tensor:
        """``x`` unchanged (a view); its backward hands the weight the summed ∇W (see above).

        Raises:
            ValueError: called a second time (one pass per ``GradSum``).
        """
        if self._collected:
            raise ValueError("GradSum.collect was already called: make one GradSum per pass")
        self._collected = True
        out = _Collect.apply(x, self.weight, self)
        self._node = out.grad_fn
        return out

    def check(self, x: Tensor, weight: Tensor) -> None:
        """Raise ValueError unless this sums ``weight``'s ∇W and ``x`` descends from the collect
        output (its autograd history reaches the identity through a few one-input ops: slices,
        views, copies): otherwise the sum would never reach the weight."""
        node, reached = x.grad_fn, False
        for _ in range(6):
            if node is None or node is self._node:
                reached = node is self._node and node is not None
                break
            parents = [f for f, _ in node.next_functions if f is not None]
            if len(parents) != 1:
                break
            node = parents[0]
        if self.weight is not weight or not (reached or self._no_graph(x)):
            raise ValueError(
                "grad_sum must be GradSum(weight) and x a slice of its collect(...) output: "
                "otherwise the summed ∇W would never reach the weight"
            )

    def _no_graph(self, x: Tensor) -> bool:
        """Nothing to lose: neither x nor the weight takes a gradient."""
        return self._collected and not x.requires_grad and not self.weight.requires_grad

    def add(self, grad_y: Tensor, x: Tensor, w_dtype: torch.dtype) -> None:
        """Add ``grad_yᵀ · x`` ([N, M]·[M, K] → [N, K]) in ``w_dtype`` to this backward pass's
        sum (called from the calls' backward)."""
        task = torch._C._current_graph_task_id()  # private but stable: torch.utils.checkpoint's
        if task != self._task:
            self.total, self._task = None, task
        gt = grad_y.t()
        fused = x.is_cuda and w_dtype == torch.float32 and x.dtype in (torch.bfloat16, torch.half)
        if fused and not torch.is_grad_enabled():  # create_graph needs the differentiable ops
            if self.total is None:
                self.total = torch.mm(gt, x, out_dtype=w_dtype)
            else:
                torch.addmm(self.total, gt, x, out_dtype=w_dtype, out=self.total)
            return
        part = gt.mm(x).to(w_dtype)
        if self.total is None:
            self.total = part
        elif torch.is_grad_enabled():
            self.total = self.total + part
        else:
            self.total.add_(part)

    def take(self) -> Tensor | None:
        """This backward pass's sum (then forgotten), or None."""
        mine = self._task == torch._C._current_graph_task_id()
        total, self.total, self._task = self.total, None, None
        return total if mine else None


class _Collect(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: Tensor, weight: Tensor, grad_sum: GradSum) -> Tensor:
        ctx.grad_sum = grad_sum
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: Tensor):
        total = ctx.grad_sum.take()
        return grad, total if ctx.needs_input_grad[1] else None, None


class _CastLinear(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx, x: Tensor, weight: Tensor, cast: Tensor, bias: Tensor | None, grad_sum: GradSum | None
    ) -> Tensor:
        ctx.save_for_backward(x, cast)
        ctx.grad_sum = grad_sum
        ctx.w_dtype = weight.dtype
        ctx.b_dtype = None if bias is None else bias.dtype
        return F.linear(x, cast, None if bias is None else bias.to(x.dtype))

    @staticmethod
    def backward(ctx, grad_y: Tensor):
        x, cast = ctx.saved_tensors
        need_x, need_w, _, need_b, _ = ctx.needs_input_grad
        g2 = grad_y.reshape(-1, grad_y.shape[-1])
        grad_x = grad_w = grad_b = None
        if need_x:
            grad_x = g2.mm(cast).reshape(x.shape)
        x2 = x.reshape(-1, x.shape[-1])
        if need_w and ctx.grad_sum is not None:
            ctx.grad_sum.add(g2, x2, ctx.w_dtype)
        elif need_w:  # MmBackward's ∇ of the column-major Wᵀ: (∇Yᵀ·X), then the cast's backward
            grad_w = g2.t().mm(x2).to(ctx.w_dtype)
        if need_b and ctx.b_dtype is not None:
            grad_b = g2.sum(0).to(ctx.b_dtype)
        return grad_x, grad_w, None, grad_b, None


def cast_linear(
    x: Tensor,
    weight: Tensor,
    cast: Tensor,
    bias: Tensor | None = None,
    *,
    grad_sum: GradSum | None = None,
) -> Tensor:
    """``y = x · castᵀ (+ bias)`` with ∇W returned to ``weight`` (fast, non-exact path).

    Args:
        x: [..., K] activations in the compute dtype.
        weight: [N, K] master weight (receives ∇W in its own dtype).
        cast: ``cast_weight(weight, x.dtype)``: [N, K] in x.dtype, no autograd history.
        bias: optional [N] (added in x.dtype).
        grad_sum: sum ∇W there instead of returning it (``GradSum(weight)``: ``x`` must descend
            from its ``collect``, or the sum never reaches the weight).
    Returns:
        [..., N] in x.dtype; bitwise ``F.linear(x, weight.to(x.dtype), bias)`` with the same
        gradients for x, weight and bias (∇W: see ``GradSum`` when given).
    Raises:
        ValueError: ``cast`` is not ``weight``'s shape in x.dtype; ``grad_sum`` is for another
            weight or ``x`` is not a slice of its ``collect`` output (under autograd).
    """
    if cast.shape != weight.shape or cast.dtype != x.dtype:
        raise ValueError(
            f"cast {tuple(cast.shape)} {cast.dtype} is not weight {tuple(weight.shape)} in "
            f"{x.dtype}: make it with cast_weight(weight, x.dtype)"
        )
    if not torch.is_grad_enabled():
        return F.linear(x, cast, None if bias is None else bias.to(x.dtype))
    if grad_sum is not None:
        grad_sum.check(x, weight)
    return _CastLinear.apply(x, weight, cast, bias, grad_sum)
