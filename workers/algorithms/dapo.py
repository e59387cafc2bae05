"""DAPO's reward shaping and batch filter (Yu et al., arXiv 2503.14476 §3.2 and §3.4).

- Soft overlong punishment: responses in the last ``overlong_buffer`` tokens before
  ``max_tokens`` lose reward linearly, reaching ``-penalty`` at ``max_tokens``; it is added to
  the task reward (verl's ``overlong_buffer`` convention).
- Dynamic sampling: a group whose rewards are all equal (all correct or all wrong) has zero
  GRPO advantages and contributes no gradient; DAPO drops it and samples more prompts to refill
  the batch. "All equal" uses the same std floor as the advantages, so exactly the groups that
  would get zero advantages are dropped.
"""

from __future__ import annotations

import torch
from torch import Tensor


def overlong_penalty(
    lengths: Tensor, *, max_tokens: int, overlong_buffer: int, penalty: float
) -> Tensor:
    """Reward term ``[B]`` (float32, <= 0) from response lengths ``[B]`` (tokens).

    ``0`` for ``len <= max_tokens - buffer``; ``-penalty · (len - (max_tokens - buffer)) / buffer``
    inside the buffer; ``-penalty`` at or beyond ``max_tokens``. ``overlong_buffer=0`` turns it
    off (all zeros). Raises ``ValueError`` when the buffer exceeds ``max_tokens``.
    """
    if overlong_buffer == 0:
        return torch.zeros(lengths.shape, dtype=torch.float32)
    if overlong_buffer > max_tokens:
        raise ValueError(f"overlong_buffer={overlong_buffer} exceeds max_tokens={max_tokens}")
    exceed = lengths.to(torch.float32) - (max_tokens - overlong_buffer)
    return -penalty * (exceed / overlong_buffer).clamp(min=0.0, max=1.0)


def dynamic_sampling_keep(rewards: Tensor, *, group_size: int, std_floor: float = 0.0) -> Tensor:
    """Which groups to keep: ``[num_groups]`` bool, True where the rewards are not all equal.

    ``rewards`` [B] with the ``group_size`` samples of one prompt contiguous. A group is kept when
    its (unbiased, float64) reward std exceeds ``std_floor``; pass ``spec.std_floor`` so the
    filter agrees with ``compute_advantages``. Per-sample mask:
    ``keep.repeat_interleave(group_size)``. Raises ``ValueError`` when B does not split into groups.
    """
    if rewards.dim() != 1 or group_size < 1 or rewards.shape[0] % group_size:
        raise ValueError(
            f"rewards {tuple(rewards.shape)} must be [B] with B a multiple of group_size={group_size}"
        )
    grouped = rewards.to(torch.float64).view(-1, group_size)
    if group_size == 1:
        return torch.zeros(grouped.shape[0], dtype=torch.bool)
    return grouped.std(dim=1) > std_floor
