"""Importance-sampling corrections for the rollout/trainer mismatch: TIS, MIS, IcePop, seq_mask.

The behaviour policy that sampled the tokens is the rollout engine (``rollout_logp``); the
trainer's ``old_logp`` is the same policy recomputed by the trainer. With
``log_w = old_logp - rollout_logp``:

- ``tis`` (truncated IS, Yao et al. "Your efficient RL framework secretly brings you off-policy
  RL training", 2025): weight ``min(w, threshold_high)``.
- ``mis`` (masked IS, verl's rollout_is "mask" mode): weight ``w`` inside
  ``[threshold_low, threshold_high]``, 0 outside.
- ``icepop`` (Ring-1T / IcePop, arXiv 2510.18855): MIS at token level whatever ``level`` says.
- ``seq_mask``: drop whole sequences whose token_mult_prob_error (NeMo RL, DESIGN.md §6) exceeds
  ``threshold_high``; kept sequences get weight 1.

``level="sequence"`` uses ``w_i = exp(sum_t log_w_t)`` for every token of sequence i (compared
in log space, so long sequences cannot overflow). In fp8rl's exact unified_fp8 mode
``log_w`` is exactly 0, so ``w = exp(0) = 1`` bit for bit and every method is an exact no-op
(the spec requires ``threshold_low <= 1 <= threshold_high`` for that reason).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from fp8rl.protocol.algorithm_spec import RolloutCorrectionSpec
from fp8rl.workers.algorithms.masking import check_token_shapes, masked_mean


@dataclass(frozen=True)
class RolloutCorrection:
    """Result of ``rollout_correction``.

    ``weights`` [B, T] (float32, no gradient): multiply the per-token policy loss by it (0 on
    masked tokens and padding). ``keep`` [B, T] bool: tokens still trained on. ``metrics``:
    ``rollout_corr/{clip_frac,mask_frac,weight_mean,weight_max}`` over real tokens.
    """

    weights: Tensor
    keep: Tensor
    metrics: dict[str, float]


def rollout_correction(
    old_logp: Tensor, rollout_logp: Tensor, mask: Tensor, *, spec: RolloutCorrectionSpec
) -> RolloutCorrection:
    """IS weights and masks that correct for rollout-engine vs trainer logprobs (see module doc).

    ``old_logp``, ``rollout_logp``: [B, T] logprobs (nats) of the sampled tokens; ``mask`` [B, T].
    Raises ``ValueError`` on shape mismatches.
    """
    check_token_shapes(mask, old_logp=old_logp, rollout_logp=rollout_logp)
    real = mask.bool()
    log_w = (old_logp.detach() - rollout_logp.detach()).to(torch.float64) * real
    level = "token" if spec.method == "icepop" else spec.level
    if level == "sequence":
        log_w = log_w.sum(dim=1, keepdim=True).expand_as(log_w)
    log_low = math.log(spec.threshold_low) if spec.threshold_low > 0 else -math.inf
    log_high = math.log(spec.threshold_high)
    clipped = torch.zeros_like(real)
    keep = real.clone()

    if spec.method == "none":
        weights = torch.ones_like(log_w)
    elif spec.method == "tis":
        clipped = (log_w > log_high) & real
        weights = torch.exp(log_w.clamp(max=log_high))
    elif spec.method in ("mis", "icepop"):
        keep = real & (log_w >= log_low) & (log_w <= log_high)
        weights = torch.exp(log_w.clamp(min=log_low, max=log_high))
    elif spec.method == "seq_mask":
        error = masked_mean(
            torch.exp((old_logp.detach() - rollout_logp.detach()).abs().double()), real, dim=1
        )
        keep = real & (error <= spec.threshold_high)[:, None]
        weights = torch.ones_like(log_w)
    else:  # pragma: no cover - the spec's Literal makes this unreachable
        raise AssertionError(spec.method)

    weights = torch.where(keep, weights, torch.zeros_like(weights))
    num_real = max(int(real.sum()), 1)
    metrics = {
        "rollout_corr/clip_frac": float(clipped.sum()) / num_real,
        "rollout_corr/mask_frac": float((real & ~keep).sum()) / num_real,
        "rollout_corr/weight_mean": float(masked_mean(weights, real)),
        "rollout_corr/weight_max": float(weights[real].max()) if real.any() else 0.0,
    }
    return RolloutCorrection(weights=weights.to(torch.float32), keep=keep, metrics=metrics)
