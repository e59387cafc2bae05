"""Masked reductions shared by the advantage, loss and metric functions.

Every tensor in ``fp8rl.workers.algorithms`` is response-token aligned: ``[B, T]`` with a
``mask`` of the same shape (1 = a real response token, 0 = padding). These helpers reduce over
the real tokens only and never divide by zero (an empty selection reduces to 0).
"""

from __future__ import annotations

import torch
from torch import Tensor


def check_token_shapes(mask: Tensor, **tensors: Tensor | None) -> None:
    """Raise ``ValueError`` naming the tensor whose shape differs from ``mask`` ([B, T])."""
    if mask.dim() != 2:
        raise ValueError(
            f"mask must be [B, T] (response-token aligned), got shape {tuple(mask.shape)}"
        )
    for name, value in tensors.items():
        if value is not None and value.shape != mask.shape:
            raise ValueError(
                f"{name} has shape {tuple(value.shape)} but mask has {tuple(mask.shape)}; "
                "all token tensors must be [B, T] and aligned with the response mask"
            )


def masked_sum(values: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """Sum of ``values * mask`` (over ``dim``, or everything when None)."""
    product = values * mask.to(values.dtype)
    return product.sum() if dim is None else product.sum(dim)


def masked_mean(values: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """Mean of ``values`` over the real tokens; 0 where ``mask`` selects nothing (never NaN)."""
    count = mask.to(values.dtype).sum() if dim is None else mask.to(values.dtype).sum(dim)
    return masked_sum(values, mask, dim) / count.clamp(min=1)


def masked_whiten(values: Tensor, mask: Tensor, *, std_floor: float) -> Tensor:
    """Global whitening ``(x - mean) / std`` over the real tokens of the whole batch.

    The std is the biased (population) std over the masked tokens, as in OpenRLHF's REINFORCE++.
    verl's ``masked_whiten`` differs: it uses the unbiased variance (``masked_var`` with
    Bessel's correction, ``n / (n - 1)``), so its whitened values are smaller by
    ``sqrt((n - 1) / n)`` (under 0.5 % apart from 100 tokens on). When the std is at or below
    ``std_floor`` there is no signal to scale up and the result is all zeros. Padding
    positions are 0 in the output.
    """
    x = values.to(torch.float64)
    m = mask.to(torch.float64)
    mean = masked_mean(x, m)
    var = masked_mean((x - mean) ** 2, m)
    std = var.sqrt()
    if std <= std_floor:
        return torch.zeros_like(values)
    return (((x - mean) / std) * m).to(values.dtype)


def last_token_index(mask: Tensor) -> Tensor:
    """Index of the last real token of each row ([B] int64; -1 for a row without tokens)."""
    positions = torch.arange(mask.shape[1], device=mask.device).expand_as(mask)
    return torch.where(mask.bool(), positions, torch.full_like(positions, -1)).amax(dim=1)
