"""The per-micro-batch RL objective the trainer calls: policy loss + KL + entropy bonus.

Like torchtitan's GRPO loss module, one small function assembles the pieces chosen by the
``AlgorithmSpec``: rollout correction (IS weights from rollout vs trainer logprobs), the policy
loss (PPO-clip or GSPO), K1/K2/K3 KL to the reference as a loss term, and the entropy bonus,
all reduced with the same aggregation and the same (optionally global) denominator.
"""

from __future__ import annotations

import torch
from torch import Tensor

from fp8rl.protocol.algorithm_spec import AlgorithmSpec
from fp8rl.workers.algorithms.kl import kl_penalty
from fp8rl.workers.algorithms.losses import aggregate_loss, gspo_loss, ppo_clip_loss
from fp8rl.workers.algorithms.losses import loss_denominator as batch_denominator
from fp8rl.workers.algorithms.masking import check_token_shapes, masked_mean
from fp8rl.workers.algorithms.rollout_correction import rollout_correction


def rl_objective(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    spec: AlgorithmSpec,
    ref_logp: Tensor | None = None,
    entropy: Tensor | None = None,
    rollout_logp: Tensor | None = None,
    loss_denominator: float | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """Scalar loss to minimise for one micro-batch, and its metrics.

    Inputs are [B, T] and response-token aligned: ``logp`` (with gradient) and ``old_logp`` are
    the trainer's logprobs of the sampled tokens now and before the update, ``advantages`` from
    ``compute_advantages``, ``mask`` 1 = real token, ``ref_logp`` the reference's (needed when
    ``spec.kl.coef > 0`` and ``spec.kl.use == "loss"``), ``entropy`` per token (for the bonus;
    logged when given), ``rollout_logp`` the engine's (needed when a rollout correction is on).
    ``loss_denominator``: tokens/sequences of the whole mini-batch (``loss_denominator(...)``);
    then the micro-batch losses and ``actor/pg_loss``, ``actor/kl``, ``actor/entropy`` sum to
    the full-batch values, while ``actor/pg_clipfrac`` and ``rollout_corr/*`` are micro-batch
    means. Raises ``ValueError`` when a tensor the spec needs is missing or misshaped.
    """
    check_token_shapes(
        mask, logp=logp, old_logp=old_logp, advantages=advantages, ref_logp=ref_logp,
        entropy=entropy, rollout_logp=rollout_logp,
    )  # fmt: skip
    agg, m = spec.loss_agg, mask.to(logp.dtype)
    denominator = (
        loss_denominator if loss_denominator is not None else batch_denominator(mask, mode=agg)
    )
    metrics: dict[str, float] = {}

    weights = torch.ones_like(logp)
    if spec.rollout_correction.method != "none":
        if rollout_logp is None:
            raise ValueError(
                f"rollout_correction.method={spec.rollout_correction.method} needs rollout_logp"
            )
        correction = rollout_correction(old_logp, rollout_logp, mask, spec=spec.rollout_correction)
        weights = correction.weights.to(logp.dtype)
        metrics.update(correction.metrics)

    clip = {"clip_ratio_low": spec.clip_ratio_low, "clip_ratio_high": spec.clip_ratio_high}
    if spec.policy_loss == "gspo":
        token_loss, clipped = gspo_loss(logp, old_logp, advantages, mask, **clip)
    else:
        token_loss, clipped = ppo_clip_loss(
            logp, old_logp, advantages, dual_clip_c=spec.dual_clip_c, **clip
        )
    pg_loss = aggregate_loss(token_loss * weights, m, mode=agg, denominator=denominator)
    loss = pg_loss
    metrics["actor/pg_loss"] = float(pg_loss.detach())
    metrics["actor/pg_clipfrac"] = float(masked_mean(clipped.to(m.dtype), m))

    if spec.kl.coef > 0 and spec.kl.use == "loss":
        if ref_logp is None:
            raise ValueError(
                "algorithm.kl.coef > 0 with kl.use=loss needs ref_logp from the reference worker"
            )
        kl = aggregate_loss(
            kl_penalty(logp, ref_logp, estimator=spec.kl.estimator, clamp=spec.kl.clamp),
            m,
            mode=agg,
            denominator=denominator,
        )
        loss = loss + spec.kl.coef * kl
        metrics["actor/kl"] = float(kl.detach())

    if entropy is not None:
        ent = aggregate_loss(entropy, m, mode=agg, denominator=denominator)
        if spec.entropy_coef > 0:
            loss = loss - spec.entropy_coef * ent
        metrics["actor/entropy"] = float(ent.detach())
    elif spec.entropy_coef > 0:
        raise ValueError("algorithm.entropy_coef > 0 needs per-token entropy")
    return loss, metrics
