"""KL to the reference policy (Schulman's k1/k2/k3 estimators) and entropy from logits.

The estimators are per token, on the sampled token only (no full-vocabulary KL): with
``log_ratio = logp - ref_logp`` (log pi/pi_ref) they are ``k1 = log_ratio``,
``k2 = log_ratio² / 2`` and ``k3 = r - 1 - log r`` with ``r = pi_ref/pi`` (unbiased, always
>= 0, low variance: the GRPO default). Source: J. Schulman, "Approximating KL Divergence"
(2020), and verl's ``kl_penalty``. The log ratio is clamped to ±20 before ``exp`` so that one
token far outside the reference's support cannot overflow the loss.
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor

from fp8rl.protocol.algorithm_spec import KLSpec
from fp8rl.workers.algorithms.masking import check_token_shapes

LOG_RATIO_CLAMP = 20.0
"""Bound on |log pi - log pi_ref| before exponentiation (exp(20) ≈ 4.9e8, finite in float32)."""


def kl_penalty(
    logp: Tensor,
    ref_logp: Tensor,
    *,
    estimator: Literal["k1", "k2", "k3"] = "k3",
    clamp: float | None = None,
) -> Tensor:
    """Per-token KL(pi || pi_ref) estimate, same shape and dtype as ``logp``.

    ``logp``/``ref_logp``: log-probabilities (nats) of the sampled tokens under the policy and
    the reference. ``clamp``: the estimate is clamped to [-clamp, clamp] (verl and NeMo RL use
    10; gradients of clamped tokens are 0). Raises ``ValueError`` for differing shapes or an
    unknown estimator.
    """
    if logp.shape != ref_logp.shape:
        raise ValueError(
            f"logp {tuple(logp.shape)} and ref_logp {tuple(ref_logp.shape)} differ in shape"
        )
    log_ratio = (logp - ref_logp).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    if estimator == "k1":
        value = log_ratio
    elif estimator == "k2":
        value = 0.5 * log_ratio.square()
    elif estimator == "k3":
        value = torch.exp(-log_ratio) - 1 + log_ratio
    else:
        raise ValueError(f"unknown KL estimator {estimator!r}; use one of k1, k2, k3")
    return value if clamp is None else value.clamp(-clamp, clamp)


def kl_reward_penalty(logp: Tensor, ref_logp: Tensor, mask: Tensor, *, kl: KLSpec) -> Tensor:
    """Token rewards ``-kl.coef · KL_t`` ([B, T], 0 on padding) for ``kl.use == "reward"``.

    Pass the result as ``token_rewards`` to ``compute_advantages`` (PPO/RLHF reward shaping,
    Ouyang et al. 2022). ``logp`` is the rollout-time policy logprob (no gradient).
    """
    check_token_shapes(mask, logp=logp, ref_logp=ref_logp)
    penalty = kl_penalty(logp.detach(), ref_logp.detach(), estimator=kl.estimator, clamp=kl.clamp)
    return -kl.coef * penalty * mask.to(penalty.dtype)


def entropy_from_logits(logits: Tensor) -> Tensor:
    """Entropy (nats) of ``softmax(logits)`` over the last dim: [..., V] -> [...], float32.

    Computed as ``-sum p · log p`` from ``log_softmax`` in float32 (stable for large logits),
    with ``0 · log 0 = 0`` so that ``-inf`` logits (masked vocabulary) give no NaN. Apply the
    sampling temperature to ``logits`` first if the entropy should match the sampler's.
    """
    logp = torch.log_softmax(logits.float(), dim=-1)
    p = logp.exp()
    plogp = torch.where(p > 0, p * logp, torch.zeros_like(p))
    return -plogp.sum(dim=-1)
