"""The trainer's attention backward on cuDNN's fused SDPA backward, fed the invariant forward's
output and log-sum-exp.

Only the forward is under the parity contract: the engine's rows must equal the trainer's forward
rows, bitwise in exact mode. The backward may be any accurate one, as the FP8 DGrad/WGrad are
(``linear._backward_gemm``). cuDNN's backward (``aten._scaled_dot_product_cudnn_attention_backward``,
the one SDPA runs on Hopper) takes ``out`` and the natural-log softmax statistics of the forward
it follows; ours stores the log2-domain log-sum-exp (``m + log2 l`` of the scaled scores), so
``lse · ln 2`` is cuDNN's. It recomputes the probabilities from the keys and that statistic, so
its gradients agree with the Triton backward's to rounding. FlashAttention-2's backward (PyTorch's
copy) was measured first: no faster than the Triton kernels on the H200 (2026-12-05).

cuDNN knows causal masks, not ``n_visible`` prefixes. Its gradient is this call's whenever every
query row either sees keys ``[0, l]`` (``n_visible = l + 1``, a causal row of a Lq = Lk call) or
has an all-zero output gradient: such a row adds nothing to dQ, dK or dV under either mask. The
trainer's padding rows (``position ≥ k_len``) are the second kind in RL losses, which mask them;
a call with any other row falls back to the Triton kernels. The check is one host sync per call.

``set_enabled(False)`` keeps every backward on the Triton kernels (A/B benchmarks).
"""

from __future__ import annotations

import math
import warnings

import torch
from torch import Tensor

_ENABLED = [True]
_NATIVE_GQA = [True]
"""Whether cuDNN takes fewer K/V heads than query heads; set False after the first refusal, and
K/V are then repeated per query head and their gradients summed back."""
_WARNED = [False]


def set_enabled(on: bool) -> bool:
    """Whether the trainer's attention backward may run cuDNN's (process-wide); returns the
    previous setting."""
    previous, _ENABLED[0] = _ENABLED[0], bool(on)
    return previous


def applies(q: Tensor, k: Tensor) -> bool:
    """Whether cuDNN can take this call's shapes: enabled, CUDA (compute capability ≥ 9.0, where
    SDPA prefers it), BF16/FP16, head size a multiple of 8 up to 128, Lq = Lk (a whole-sequence
    causal call), cuDNN available. q: [B, H, Lq, D]; k: [B, Hkv, Lk, D]."""
    d = q.shape[-1]
    return (
        _ENABLED[0]
        and q.is_cuda
        and q.dtype in (torch.bfloat16, torch.float16)
        and d % 8 == 0
        and d <= 128
        and q.shape[2] == k.shape[2]
        and torch.backends.cudnn.is_available()
        and torch.cuda.get_device_capability(q.device) >= (9, 0)
    )


def causal_or_silent(n_visible: Tensor, grad_out: Tensor) -> bool:
    """True when every query row is causal (``n_visible[b, l] == l + 1``) or has an all-zero
    output gradient, i.e. a causal backward is this call's (module doc). One host sync.

    n_visible: [B, Lq] integer key counts; grad_out: [B, H, Lq, D]."""
    lq = n_visible.shape[1]
    causal = n_visible == torch.arange(1, lq + 1, device=n_visible.device, dtype=n_visible.dtype)
    silent = grad_out.abs().amax(dim=(1, 3)) == 0  # [B, Lq]
    return bool((causal | silent).all())


def _cudnn(do, q, k, v, out, lse, scale):
    n = q.shape[2]
    zero = torch.zeros((), dtype=torch.int64, device=q.device)
    dq, dk, dv = torch.ops.aten._scaled_dot_product_cudnn_attention_backward(
        do, q, k, v, out, lse, zero, zero, None, None, None, n, n, 0.0, True, scale=scale
    )
    return dq, dk, dv


def backward(
    q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse2: Tensor, grad_out: Tensor, scale: float
) -> tuple[Tensor, Tensor, Tensor] | None:
    """cuDNN's causal backward from the invariant forward's ``out`` and log2-domain ``lse2``.

    Args:
        q: [B, H, L, D]; k, v: [B, Hkv, L, D] (H a multiple of Hkv), BF16/FP16, CUDA.
        out: [B, H, L, D] the forward's output; lse2: [B, H, L] float32, its ``m + log2 l``.
        grad_out: [B, H, L, D]; scale: the forward's softmax scale.
    Returns:
        dq, dk, dv shaped like q, k, v; or None when cuDNN refuses the call (a RuntimeError from
        the op, e.g. a cuDNN build without this SDPA graph): the caller then runs the Triton
        kernels, and a warning names the error once.
    """
    lse = (lse2 * math.log(2.0)).unsqueeze(-1).contiguous()  # cuDNN's stats: [B, H, L, 1]
    do = grad_out.contiguous() if grad_out.stride() != out.stride() else grad_out
    g = q.shape[1] // k.shape[1]
    try:
        if g == 1 or _NATIVE_GQA[0]:
            try:
                return _cudnn(do, q, k, v, out, lse, scale)
            except RuntimeError:
                if g == 1:
                    raise
                _NATIVE_GQA[0] = False
        b, hkv, n, d = k.shape
        ke, ve = k.repeat_interleave(g, 1), v.repeat_interleave(g, 1)
        dq, dk, dv = _cudnn(do, q, ke, ve, out, lse, scale)
        return dq, dk.view(b, hkv, g, n, d).sum(2), dv.view(b, hkv, g, n, d).sum(2)
    except RuntimeError as err:
        if not _WARNED[0]:
            _WARNED[0] = True
            msg = f"cuDNN attention backward refused ({err}); using the Triton kernels"
            warnings.warn(msg, stacklevel=2)
        return None
