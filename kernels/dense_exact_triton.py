"""Batch-invariant BF16 dense GEMM for ``precision.exact`` on CUDA (Triton); the token
log-softmax rows are ``logprob_triton``'s.

The exact vocabulary head on CPU is float64 (``dense_exact.py``, ``invariant.token_logprobs``);
on the H200 that float64 GEMM and the float64 [T, V] log-softmax cost more than the whole fast
train step. These kernels give the same guarantee — a row's bits depend only on that row — with
fp32 accumulation:

* ``exact_dense_gemm``: ``y = x·Wᵀ (+ b)``, BF16/FP16 operands, fp32 accumulator, rounded once.
  One program owns one ``BLOCK_M × BLOCK_N`` output tile and walks K in ``BLOCK_K`` steps from 0,
  one ``tl.dot`` per step into the same accumulator; one compiled config for every M (``M`` is
  excluded from Triton's specialisation), no split-K, no atomics. An MMA tile's row does not read
  other rows, so row i of a 1-row call equals row i of a 4096-row call bitwise (the argument of
  ``gemm_triton.py``'s exact mode).

Backward passes (trainer only) use cuBLAS / torch in the compute dtype with fp32 accumulation:
deterministic, not bitwise anything.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from fp8rl.kernels.dense_cast import GradSum

GEMM_BLOCK = (128, 128, 64)  # BLOCK_M, BLOCK_N, BLOCK_K
GEMM_WARPS, GEMM_STAGES, GROUP_M = 8, 3, 8

__all__ = ["exact_dense_gemm"]


@triton.jit(do_not_specialize=["M"])
def _gemm_kernel(
    x_ptr, w_ptr, b_ptr, y_ptr, M, N, K, stride_xm, stride_wn, stride_ym,
    HAS_BIAS: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
    GM: tl.constexpr,
):  # fmt: skip
    pid = tl.program_id(0)
    num_m = tl.cdiv(M, BM)
    num_n = tl.cdiv(N, BN)
    width = GM * num_n  # grouped tile order for L2 reuse; does not change any tile's math
    first_m = (pid // width) * GM
    group = tl.minimum(num_m - first_m, GM)
    pid_m = first_m + (pid % width) % group
    pid_n = (pid % width) // group
    rm = pid_m * BM + tl.arange(0, BM)
    rn = pid_n * BN + tl.arange(0, BN)
    rk = tl.arange(0, BK)
    m_ok, n_ok = rm < M, rn < N
    x_ptrs = x_ptr + rm.to(tl.int64)[:, None] * stride_xm + rk[None, :]
    w_ptrs = w_ptr + rn.to(tl.int64)[None, :] * stride_wn + rk[:, None]
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k0 in range(0, K, BK):
        k_ok = rk < K - k0
        a = tl.load(x_ptrs, mask=m_ok[:, None] & k_ok[None, :], other=0.0)
        b = tl.load(w_ptrs, mask=k_ok[:, None] & n_ok[None, :], other=0.0)
        acc = tl.dot(a, b, acc)
        x_ptrs += BK
        w_ptrs += BK
    if HAS_BIAS:
        acc += tl.load(b_ptr + rn, mask=n_ok, other=0.0).to(tl.float32)[None, :]
    y_ptrs = y_ptr + rm.to(tl.int64)[:, None] * stride_ym + rn[None, :]
    tl.store(y_ptrs, acc.to(y_ptr.dtype.element_ty), mask=m_ok[:, None] & n_ok[None, :])


def _gemm(x2: Tensor, w: Tensor, bias: Tensor | None) -> Tensor:
    m, k = x2.shape
    n = w.shape[0]
    y = torch.empty(m, n, dtype=x2.dtype, device=x2.device)
    if m == 0 or n == 0:
        return y
    bm, bn, bk = GEMM_BLOCK
    grid = (triton.cdiv(m, bm) * triton.cdiv(n, bn),)
    _gemm_kernel[grid](
        x2, w, bias if bias is not None else w, y, m, n, k, x2.stride(0), w.stride(0), y.stride(0),
        HAS_BIAS=bias is not None, BM=bm, BN=bn, BK=bk, GM=GROUP_M,
        num_warps=GEMM_WARPS, num_stages=GEMM_STAGES,
    )  # fmt: skip
    return y


class _ExactDense(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, cast, grad_sum):
        w = (weight.to(x.dtype) if cast is None else cast).contiguous()
        b = None if bias is None else bias.to(x.dtype).contiguous()
        x2 = x.reshape(-1, x.shape[-1]).contiguous()
        ctx.save_for_backward(x, weight, bias, cast)
        ctx.grad_sum = grad_sum
        return _gemm(x2, w, b).reshape(*x.shape[:-1], w.shape[0])

    @staticmethod
    def backward(ctx, grad_out: Tensor):
        x, weight, bias, cast = ctx.saved_tensors
        need_x, need_w, need_b, _, _ = ctx.needs_input_grad
        g = grad_out.reshape(-1, grad_out.shape[-1])
        x2 = x.reshape(-1, x.shape[-1])
        w = weight.to(x.dtype) if cast is None else cast
        grad_x = (g @ w).reshape(x.shape) if need_x else None
        grad_w = None
        if need_w and ctx.grad_sum is not None:
            ctx.grad_sum.add(g, x2, weight.dtype)
        elif need_w:
            grad_w = (g.t() @ x2).to(weight.dtype)
        grad_b = g.float().sum(0).to(x.dtype).to(bias.dtype) if need_b else None
        return grad_x, grad_w, grad_b, None, None


def exact_dense_gemm(
    x: Tensor,
    weight: Tensor,
    bias: Tensor | None = None,
    *,
    cast: Tensor | None = None,
    grad_sum: GradSum | None = None,
) -> Tensor:
    """y = x·Wᵀ + b with a batch-invariant fixed-tile Triton GEMM (fp32 accumulation).

    Args:
        x: [..., K] BF16/FP16 on CUDA. weight: [N, K] (any float dtype; used as its x.dtype
            copy, like ``invariant.dense_linear``). bias: [N] or None.
        cast: that x.dtype copy made once for several calls (``dense_cast.cast_weight``), or
            None to cast here.
        grad_sum: sum ∇W there instead of returning it (``dense_cast.GradSum(weight)``; x a
            slice of its ``collect`` output).
    Returns:
        [..., N] in x.dtype; differentiable (backward through cuBLAS, deterministic).
    Raises:
        ValueError: ``cast`` is not ``weight``'s shape in x.dtype; ``grad_sum`` is for another
            weight or does not cover x (under autograd).
    """
    if cast is not None and (cast.shape != weight.shape or cast.dtype != x.dtype):
        raise ValueError(f"cast {tuple(cast.shape)} {cast.dtype} is not weight in {x.dtype}")
    if torch.is_grad_enabled() and grad_sum is not None:
        grad_sum.check(x, weight)
    return _ExactDense.apply(x, weight, bias, cast, grad_sum)
