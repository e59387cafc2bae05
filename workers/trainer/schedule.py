"""Learning-rate schedule: linear warmup, then constant, cosine or linear decay (pure function)."""

from __future__ import annotations

import math


def lr_factor(
    step: int, *, warmup_steps: int, total_steps: int, schedule: str, min_ratio: float
) -> float:
    """Multiplier of the peak LR at optimizer step ``step`` (0-based).

    Warmup ramps linearly from 1/(warmup+1) to 1 over ``warmup_steps``; afterwards ``constant``
    stays at 1, ``cosine``/``linear`` decay to ``min_ratio`` at ``total_steps``.
    """
    if step < warmup_steps:
        return (step + 1) / (warmup_steps + 1)
    if schedule == "constant":
        return 1.0
    span = max(1, total_steps - warmup_steps)
    progress = min(1.0, (step - warmup_steps) / span)
    if schedule == "cosine":
        decay = 0.5 * (1 + math.cos(math.pi * progress))
    elif schedule == "linear":
        decay = 1 - progress
    else:
        raise ValueError(f"unknown lr_schedule {schedule!r}; use constant, cosine or linear")
    return min_ratio + (1 - min_ratio) * decay
