"""Fused q/k/v and gate/up FP8 weights for the fast inference path (issue 14).

An inference model holds one ``FP8Linear.from_quantized`` per projection. Decode reads the same
normalised activation into q/k/v (and into gate/up): three (two) quantizations, three (two) GEMM
launches. ``fuse_quantized_linears`` concatenates the codes and scales of such siblings into one
``[ΣN, K]`` 128×128-block weight and makes each module's ``weight_codes``/``weight_scale``
buffers *views* of it, so weight updates (``load_quantized``, the receiver's in-place
``copy_``) and state dicts keep working unchanged and the fused weight never goes stale. A caller
checks ``still_fused`` before using the fused weight (``module.to()`` would break the views).

Concatenating along N does not change any output column's arithmetic in exact mode (fixed
tiles, N blocks aligned to 128), but exact mode keeps the unfused path anyway.
"""

from __future__ import annotations

import torch
from torch import nn

from fp8rl.kernels.quant import GROUP, QuantizedTensor


def _fusable(modules: list[nn.Module]) -> bool:
    from fp8rl.kernels import FP8Linear

    return all(
        isinstance(m, FP8Linear)
        and m.weight is None
        and m.out_features % GROUP == 0
        and m.in_features == modules[0].in_features
        and m.weight_codes.device == modules[0].weight_codes.device
        for m in modules
    )


def fuse_quantized_linears(modules: list[nn.Module]) -> QuantizedTensor | None:
    """One ``[ΣN, K]`` weight whose row slices are the modules' codes/scales (views), or None.

    Args:
        modules: inference ``FP8Linear`` modules (``from_quantized``) with the same K and every
            N a multiple of 128. Anything else (trainable, dense, ragged N) returns None.
    Returns:
        The fused ``QuantizedTensor`` (codes float8 ``[ΣN, K]``, scale ``[ΣN/128, ceil(K/128)]``).
    """
    if not modules or not _fusable(modules):
        return None
    with torch.no_grad():
        codes = torch.cat([m.weight_codes.view(torch.uint8) for m in modules]).view(
            modules[0].weight_codes.dtype
        )
        scale = torch.cat([m.weight_scale for m in modules])
    row = 0
    for m in modules:
        n = m.out_features
        m._buffers["weight_codes"] = codes[row : row + n]
        m._buffers["weight_scale"] = scale[row // GROUP : (row + n) // GROUP]
        row += n
    return QuantizedTensor(codes, scale, (GROUP, GROUP))


def still_fused(fused: QuantizedTensor | None, modules: list[nn.Module]) -> bool:
    """True when every module's buffers are still the views ``fuse_quantized_linears`` made."""
    if fused is None:
        return False
    row, base, scale_base = 0, fused.codes.data_ptr(), fused.scale.data_ptr()
    for m in modules:
        codes, scale = getattr(m, "weight_codes", None), getattr(m, "weight_scale", None)
        if codes is None or codes.data_ptr() != base + row * fused.codes.stride(0):
            return False
        offset = (row // GROUP) * fused.scale.stride(0) * fused.scale.element_size()
        if scale is None or scale.data_ptr() != scale_base + offset:
            return False
        row += m.out_features
    return True
