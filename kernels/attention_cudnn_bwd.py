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
has an all-zero output gradient. Such a silent row adds nothing to dQ, dK or dV under the prefix
mask, but under the causal mask it would meet keys its log-sum-exp never counted (a padding row
``l ≥ k_len`` and the padding keys ``[k_len, l]``), whose recomputed probabilities are unbounded:
an overflow times a zero gradient is NaN. So each non-causal row's statistic is replaced by
``SILENT_LSE``: every probability of that row is then exactly 0 and it adds exactly nothing, as
under the prefix mask. The trainer's padding rows are silent in RL losses, which mask them (the
native decoder's and Megatron's right padding alike); a call with a non-causal row that has a
gradient runs the Triton kernels. The check is one host sync per call.

cuDNN's backward was measured run-to-run identical on the H200 (``attention_backward_ab.py``);
PyTorch does not promise it, so under ``torch.use_deterministic_algorithms(True)`` the Triton
kernels (deterministic by construction) run instead. ``set_enabled(False)`` keeps every backward
on them (A/B benchmarks).
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
SILENT_LSE = 1e30
"""Natural-log statistic given to cuDNN for rows without an output gradient: ``exp(s - 1e30)`` is
0 for every finite score (and stays finite after cuDNN's ``· log2 e``)."""


def set_enabled(on: bool) -> bool:
    """Whether the trainer's attention backward may run cuDNN's (process-wide); returns the
    previous setting."""
    previous, _ENABLED[0] = _ENABLED[0], bool(on)
    return previous


def applies(q: Tensor, k: Tensor) -> bool:
    """Whether cuDNN can take this call's shapes: enabled, CUDA (compute capability ≥ 9.0, where
    SDPA prefers it), BF16/FP16, head size a multiple of 8 up to 128, Lq = Lk (a whole-sequence
    causal call), not empty, cuDNN available, and deterministic algorithms not requested
    (``torch.use_deterministic_algorithms``: the Triton kernels then run). q: [B, H, Lq, D];
    k: [B, Hkv, Lk, D]."""
    d = q.shape[-1]
    return (
        _ENABLED[0]
        and q.is_cuda
        and q.numel() > 0
        and not torch.are_deterministic_algorithms_enabled()
        and q.dtype in (torch.bfloat16, torch.float16)
        and d % 8 == 0
        and d <= 128
        and q.shape[2] == k.shape[2]
        and torch.backends.cudnn.is_available()
        and torch.cuda.get_device_capability(q.device) >= (9, 0)
    )


def causal_rows(n_visible: Tensor) -> Tensor:
    """[B, Lq] bool: which query rows are causal (``n_visible[b, l] == l + 1``).
    n_visible: [B, Lq] integer key counts."""
    lq = n_visible.shape[1]
    return n_visible == torch.arange(1, lq + 1, device=n_visible.device, dtype=n_visible.dtype)


def causal_or_silent(causal: Tensor, grad_out: Tensor) -> bool:
    """True when every query row is causal or has an all-zero output gradient, i.e. cuDNN's
    causal backward with ``SILENT_LSE`` on the other rows is this call's (module doc). One host
    sync.

    causal: [B, Lq] bool (``causal_rows``); grad_out: [B, H, Lq, D]."""
    loud = grad_out.ne(0).any(dim=3).any(dim=1)  # [B, Lq]: a row with some nonzero gradient
    return not bool((loud & ~causal).any())


_NOT_REFUSALS = tuple(
    e for e in (torch.OutOfMemoryError, getattr(torch, "AcceleratorError", None)) if e is not None
)


def _cudnn(do, q, k, v, out, lse, scale):
    n = q.shape[2]
    zero = torch.zeros((), dtype=torch.int64, device=q.device)
    dq, dk, dv = torch.ops.aten._scaled_dot_product_cudnn_attention_backward(
        do, q, k, v, out, lse, zero, zero, None, None, None, n, n, 0.0, True, scale=scale
    )
    return dq, dk, dv


def backward(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    out: Tensor,
    lse2: Tensor,
    grad_out: Tensor,
    scale: float,
    causal: Tensor,
) -> tuple[Tensor, Tensor, Tensor] | None:
    """cuDNN's causal backward from the invariant forward's ``out`` and log2-domain ``lse2``.

    Args:
        q: [B, H, L, D]; k, v: [B, Hkv, L, D] (H a multiple of Hkv), BF16/FP16, CUDA.
        out: [B, H, L, D] the forward's output; lse2: [B, H, L] float32, its ``m + log2 l``.
        grad_out: [B, H, L, D]; scale: the forward's softmax scale.
        causal: [B, L] bool (``causal_rows``); the other rows must have a zero ``grad_out``
            (``causal_or_silent``): they get ``SILENT_LSE``.
    Returns:
        dq, dk, dv shaped like q, k, v; or None when cuDNN refuses the call (a RuntimeError from
        the op, e.g. a cuDNN build without this SDPA graph): the caller then runs the Triton
        kernels, and a warning names the error once.
    Raises:
        torch.OutOfMemoryError, torch.AcceleratorError: from the op (not refusals).
    """
    lse = torch.where(causal[:, None, :], lse2 * math.log(2.0), SILENT_LSE)
    lse = lse.unsqueeze(-1).contiguous()  # cuDNN's stats: [B, H, L, 1]
    do = grad_out.contiguous() if grad_out.stride() != out.stride() else grad_out
    g = q.shape[1] // k.shape[1]
    try:
        if g == 1 or _NATIVE_GQA[0]:
            try:
                return _cudnn(do, q, k, v, out, lse, scale)
            except _NOT_REFUSALS:
                raise
            except RuntimeError as err:
                if g == 1:
                    raise
                _NATIVE_GQA[0] = False
                msg = f"cuDNN attention backward refused GQA ({err}); repeating K/V per head"
                warnings.warn(msg, stacklevel=2)
        b, hkv, n, d = k.shape
        ke, ve = k.repeat_interleave(g, 1), v.repeat_interleave(g, 1)
        dq, dk, dv = _cudnn(do, q, ke, ve, out, lse, scale)
        return dq, dk.view(b, hkv, g, n, d).sum(2), dv.view(b, hkv, g, n, d).sum(2)
    except _NOT_REFUSALS:
        raise  # not a refusal: out of memory, or a CUDA error the Triton kernels would meet too
    except RuntimeError as err:
        if not _WARNED[0]:
            _WARNED[0] = True
            msg = f"cuDNN attention backward refused ({err}); using the Triton kernels"
            warnings.warn(msg, stacklevel=2)
        return None
