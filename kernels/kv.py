"""Per-tensor FP8 (E4M3) KV-cache quantization with an explicit, calibrated scale.

The trainer and every engine apply the same round trip to keys and values (quantize with the
layer's ``k_scale``/``v_scale``, dequantize to the compute dtype), so an FP8 KV cache keeps the
unified precision flow: the trainer's attention sees exactly the keys an engine reads back from
its FP8 cache. Scales are measured by the trainer (amax / 448 of the last scoring pass), shipped
with each weight update and versioned with the weights. A scale that is zero, negative or not
finite means "not calibrated" and is refused instead of silently used.
"""

from __future__ import annotations

import torch
from torch import Tensor

from fp8rl.kernels.quant import FP8_DTYPE, FP8_E4M3_MAX, MIN_SCALE


def check_kv_scale(scale: Tensor, name: str) -> None:
    """Raise ValueError unless ``scale`` is a positive finite calibrated value (one host sync)."""
    value = float(scale)
    if not (value > 0 and value != float("inf")):
        raise ValueError(
            f"{name} is {value}: the FP8 KV cache is not calibrated (the trainer calibrates it "
            "before the first rollout and ships new scales with every weight update)"
        )


def kv_quantize(x: Tensor, scale: Tensor) -> Tensor:
    """E4M3 codes of ``x / scale`` clamped to ±448. x: any shape; scale: 0-d float32 → same shape."""
    return (x.float() / scale).clamp(-FP8_E4M3_MAX, FP8_E4M3_MAX).to(FP8_DTYPE)


def kv_dequantize(codes: Tensor, scale: Tensor, dtype: torch.dtype) -> Tensor:
    """``codes * scale`` computed in float32 and rounded once to ``dtype`` (elementwise, invariant)."""
    return (codes.float() * scale).to(dtype)


def kv_scale_from_amax(amax: Tensor) -> Tensor:
    """Per-tensor scale amax / 448 (float32), floored at the smallest normal for all-zero tensors."""
    return torch.clamp(amax.float() / FP8_E4M3_MAX, min=MIN_SCALE)


class _KVRoundTrip(torch.autograd.Function):
    """Forward: FP8 quantize → dequantize; backward: straight-through (identity) gradient."""

    @staticmethod
    def forward(ctx, x, scale, dtype):
        return kv_dequantize(kv_quantize(x, scale), scale, dtype)

    @staticmethod
    def backward(ctx, grad):
        return grad, None, None


def kv_round_trip(x: Tensor, scale: Tensor, dtype: torch.dtype) -> Tensor:
    """``kv_dequantize(kv_quantize(x, scale), scale, dtype)`` with a straight-through gradient.

    Bitwise the keys/values an engine reads back from its FP8 cache; in the backward the round
    trip counts as identity (the float8 cast has no useful derivative: without this the k_proj /
    v_proj weights of a trainer with an FP8 KV cache get zero gradients).
    x: any shape; scale: 0-d float32 → x's shape in ``dtype``.
    """
    return _KVRoundTrip.apply(x, scale, dtype)
