"""Rollout/trainer mismatch metrics (DESIGN.md §6), logged every step over real response tokens.

``d = logp_train - logp_rollout`` per sampled token. NeMo RL's ``token_mult_prob_error`` is the
mean of ``exp(|d|)`` (1.0 is perfect; 1.03-1.05 is called acceptable there); ``kl_k3`` is the
mean of ``r - 1 - log r`` with ``r = p_train/p_rollout`` (>= 0, an estimate of
KL(rollout || train) from rollout samples). Computed in float64 so that a mismatch of a few ulps
still shows and an exact match (fp8rl's ``precision.exact``) reads exactly 1.0 / 0.0.
"""

from __future__ import annotations

import torch
from torch import Tensor

from fp8rl.workers.algorithms.masking import check_token_shapes, masked_mean


def mismatch_metrics(logp_train: Tensor, logp_rollout: Tensor, mask: Tensor) -> dict[str, float]:
    """``mismatch/{token_mult_prob_error,kl_k3,abs_dlogp_max,abs_dlogp_mean}`` over real tokens.

    Inputs [B, T] (logprobs in nats of the same sampled token ids; ``mask`` 1 = real token).
    Without any real token the metrics read as a perfect match (1.0, 0, 0, 0). Raises
    ``ValueError`` on shape mismatches.
    """
    check_token_shapes(mask, logp_train=logp_train, logp_rollout=logp_rollout)
    real = mask.bool()
    d = (logp_train.detach().double() - logp_rollout.detach().double()) * real
    abs_d = d.abs()
    if not real.any():
        return {
            "mismatch/token_mult_prob_error": 1.0,
            "mismatch/kl_k3": 0.0,
            "mismatch/abs_dlogp_max": 0.0,
            "mismatch/abs_dlogp_mean": 0.0,
        }
    return {
        "mismatch/token_mult_prob_error": float(masked_mean(torch.exp(abs_d), real)),
        "mismatch/kl_k3": float(masked_mean(torch.expm1(d) - d, real)),
        "mismatch/abs_dlogp_max": float(abs_d[real].max()),
        "mismatch/abs_dlogp_mean": float(masked_mean(abs_d, real)),
    }


def mismatch_by_position(logp_train: Tensor, logp_rollout: Tensor, mask: Tensor) -> Tensor:
    """Mean ``|logp_train - logp_rollout|`` per response position: [B, T] -> [T] float64.

    The curve shows whether the mismatch grows along long generations. Positions without any
    real token read 0 (never NaN).
    """
    check_token_shapes(mask, logp_train=logp_train, logp_rollout=logp_rollout)
    abs_d = (logp_train.detach().double() - logp_rollout.detach().double()).abs()
    return masked_mean(abs_d, mask.bool(), dim=0)
