"""Triton backward passes of the fast path's RMSNorm and SwiGLU product (trainer only).

``fused.rms_norm_fast`` / ``silu_mul_fast`` run Triton forwards (bitwise the values the rollout
engine's fused norm-quant and SwiGLU-quant kernels quantize). Their backward used to recompute
the torch composition and differentiate it with autograd: for RMSNorm about 15 elementwise
kernels over float32 copies of the [tokens, H] activations, for SwiGLU six passes over
[tokens, I]. At Llama-3.1-8B's shapes and 16K tokens that is ~5 GB moved per norm and ~7.5 GB per
SwiGLU, ~30 ms of HBM time per 8-layer train step in either precision mode. These kernels read
the forward's inputs and the output gradient once and write the input gradients once.

* ``rms_norm_backward``: ``y = w · n``, ``n = x · r``, ``r = (mean(x²) + eps)^-½`` (float32
  statistics, ``w`` and ``n`` rounded to x's dtype as in ``fused.rms_norm_reference``);
  ``∇n = ∇y · w`` (rounded to x's dtype, as autograd's product is), ``∇x = r · (∇n − n ·
  mean(∇n · n))``, ``∇w = Σ_rows ∇y · n``. Each program owns a contiguous run of rows and
  writes its float32 ``∇w`` partial; ``torch.sum`` adds the partials (deterministic for a given
  shape, not batch-invariant, as the autograd composition was not).
* ``silu_mul_backward``: ``y = silu(g) · u``: ``∇u = ∇y · silu(g)``, ``∇g = ∇y · u · σ(g) ·
  (1 + g · (1 − σ(g)))``, float32 inside, rounded once to the inputs' dtypes.

They need not be bitwise anything (the forward is the contract); they round less often than the
autograd composition did (tests: against float64 autograd, ``TRITON_INTERPRET=1`` on CPU and
``tests/fp8_kernels/test_fused_backward_gpu.py``).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

RMS_PROGRAMS = 528
"""Most programs of the RMSNorm backward (4 per H200 SM; at H = 4,096 two fit an SM at once, so
about two waves): each sums ∇w over its run of rows."""
SILU_BLOCK = (16, 256)
"""Rows × columns per program of the SwiGLU backward."""


@triton.jit(do_not_specialize=["M", "rows_per_program"])
def _rms_norm_bwd_kernel(
    X, W, G, DX, DW, M, H, rows_per_program, stride_x, stride_g, eps, BLOCK_H: tl.constexpr,
):  # fmt: skip
    pid = tl.program_id(0)
    cols = tl.arange(0, BLOCK_H)
    ok = cols < H
    dtype = X.dtype.element_ty
    w = tl.load(W + cols, mask=ok, other=0.0).to(dtype).to(tl.float32)
    dw = tl.zeros([BLOCK_H], tl.float32)
    first = pid * rows_per_program
    x_row = X + first.to(tl.int64) * stride_x  # pointers walk the program's rows
    g_row = G + first.to(tl.int64) * stride_g
    dx_row = DX + first.to(tl.int64) * H
    for _ in range(first, tl.minimum(first + rows_per_program, M)):
        x = tl.load(x_row + cols, mask=ok, other=0.0).to(tl.float32)
        g = tl.load(g_row + cols, mask=ok, other=0.0).to(tl.float32)
        r = tl.math.rsqrt(tl.sum(x * x, 0) / H + eps)
        n = x * r
        dw += g * n.to(dtype).to(tl.float32)
        gn = (g * w).to(dtype).to(tl.float32)
        dx = r * (gn - n * (tl.sum(gn * n, 0) / H))
        tl.store(dx_row + cols, dx.to(dtype), mask=ok)
        x_row += stride_x
        g_row += stride_g
        dx_row += H
    tl.store(DW + pid.to(tl.int64) * H + cols, dw, mask=ok)


@triton.jit(do_not_specialize=["M"])  # N and the strides specialized: 16-byte accesses
def _silu_mul_bwd_kernel(
    GATE, UP, G, DGATE, DUP, M, N, stride_gate, stride_up, stride_g,
    BLOCK_R: tl.constexpr, BLOCK_I: tl.constexpr,
):  # fmt: skip
    rows = (tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)).to(tl.int64)
    cols = tl.program_id(1) * BLOCK_I + tl.arange(0, BLOCK_I)
    mask = (rows < M)[:, None] & (cols < N)[None, :]
    gate = tl.load(GATE + rows[:, None] * stride_gate + cols[None, :], mask=mask, other=0.0)
    up = tl.load(UP + rows[:, None] * stride_up + cols[None, :], mask=mask, other=0.0)
    grad = tl.load(G + rows[:, None] * stride_g + cols[None, :], mask=mask, other=0.0)
    g, u, d = gate.to(tl.float32), up.to(tl.float32), grad.to(tl.float32)
    sig = tl.sigmoid(g)
    d_up = d * g * sig
    d_gate = d * u * sig * (1.0 + g * (1.0 - sig))
    out = rows[:, None] * N + cols[None, :]
    tl.store(DGATE + out, d_gate.to(DGATE.dtype.element_ty), mask=mask)
    tl.store(DUP + out, d_up.to(DUP.dtype.element_ty), mask=mask)


def _rows2d(t: Tensor) -> Tensor:
    """``t`` as [rows, last] with a unit last stride (a view when its strides allow)."""
    t2 = t.reshape(-1, t.shape[-1])
    return t2 if t2.stride(-1) == 1 else t2.contiguous()


def rms_norm_backward(x: Tensor, weight: Tensor, grad: Tensor, eps: float) -> tuple[Tensor, Tensor]:
    """∇x and ∇weight of ``weight · rms_norm(x)`` (``fused.rms_norm_reference``'s function).

    Args:
        x: [..., H] BF16/FP16/FP32 (the forward's input). weight: [H] (any float dtype).
        grad: ∇y, x's shape. eps: the forward's epsilon.
    Returns:
        (∇x in x's shape and dtype, ∇weight [H] in weight's dtype; summed in float32).
    """
    x2, g2 = _rows2d(x), _rows2d(grad)
    rows, h = x2.shape
    dx = torch.empty((rows, h), dtype=x.dtype, device=x.device)
    programs = max(1, min(rows, RMS_PROGRAMS))
    per_program = triton.cdiv(rows, programs) if rows else 0
    partial = torch.empty((programs, h), dtype=torch.float32, device=x.device)
    block = triton.next_power_of_2(h)
    _rms_norm_bwd_kernel[(programs,)](
        x2, weight.contiguous(), g2, dx, partial, rows, h, per_program, x2.stride(0),
        g2.stride(0), float(eps), BLOCK_H=block, num_warps=8 if block <= 4096 else 16,
    )  # fmt: skip
    return dx.reshape(x.shape), partial.sum(0).to(weight.dtype)


def silu_mul_backward(gate: Tensor, up: Tensor, grad: Tensor) -> tuple[Tensor, Tensor]:
    """∇gate and ∇up of ``silu(gate) · up``.

    Args:
        gate, up: [..., I] BF16/FP16/FP32 (views with a unit last stride are read in place).
        grad: ∇y of the same shape.
    Returns:
        (∇gate, ∇up), contiguous, in the inputs' shapes and dtypes.
    """
    g2, u2, d2 = _rows2d(gate), _rows2d(up), _rows2d(grad)
    rows, inter = g2.shape
    d_gate = torch.empty((rows, inter), dtype=gate.dtype, device=gate.device)
    d_up = torch.empty((rows, inter), dtype=up.dtype, device=up.device)
    br, bi = SILU_BLOCK
    grid = (triton.cdiv(rows, br), triton.cdiv(inter, bi))
    if rows and inter:
        _silu_mul_bwd_kernel[grid](
            g2, u2, d2, d_gate, d_up, rows, inter, g2.stride(0), u2.stride(0), d2.stride(0),
            BLOCK_R=br, BLOCK_I=bi, num_warps=4,
        )  # fmt: skip
    return d_gate.reshape(gate.shape), d_up.reshape(up.shape)
