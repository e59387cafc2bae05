"""Advantage estimators: GRPO, Dr. GRPO, RLOO, REINFORCE++ (± group baseline) and GAE.

Design notes
- Outcome rewards are one scalar per response (``rewards[B]``); optional per-token rewards
  (``token_rewards[B, T]``, e.g. a KL penalty used as reward) are added to it. Group estimators
  (GRPO, Dr. GRPO, RLOO) score a response with ``rewards + sum_t token_rewards``; token-level
  estimators (REINFORCE++, GAE) place the outcome reward on the last real token.
- Samples of one prompt are contiguous (``B = num_prompts × group_size``), as the rollout worker
  returns them.
- Group statistics are computed in float64: eight rewards of 0.35 in float32 must give a mean
  of exactly those rewards, not a residue that a small std then blows up.
- Std floor: a group (or batch, for the global whitening estimators) whose reward std is at or
  below ``spec.std_floor`` carries no signal and gets ZERO advantages — never NaN, never noise
  divided by ~0. This holds for all-equal groups and for float residue (rewards equal in exact
  arithmetic but computed differently, or differing by ~1e-4). It also applies to the
  estimators that do not divide by the std (Dr. GRPO, RLOO), so the same groups are dropped.
- ``returns`` is the discounted return-to-go of the token reward sequence (outcome on the last
  token), except for GAE where it is ``advantages + values`` (the critic's regression target).
"""

from __future__ import annotations

import torch
from torch import Tensor

from fp8rl.protocol.algorithm_spec import AlgorithmSpec
from fp8rl.workers.algorithms.masking import check_token_shapes, last_token_index, masked_whiten


def _grouped(rewards: Tensor, group_size: int) -> Tensor:
    if rewards.dim() != 1:
        raise ValueError(
            f"rewards must be [B] (one scalar per response), got {tuple(rewards.shape)}"
        )
    if group_size < 1 or rewards.shape[0] % group_size:
        raise ValueError(
            f"rewards has {rewards.shape[0]} responses, not a multiple of group_size={group_size} "
            "(B = num_prompts × n, samples of one prompt contiguous)"
        )
    return rewards.to(torch.float64).view(-1, group_size)


def _group_std(grouped: Tensor) -> Tensor:
    if grouped.shape[1] == 1:
        return torch.zeros_like(grouped[:, :1])
    return grouped.std(dim=1, keepdim=True)  # unbiased, as verl and TRL


def group_normalized_advantages(
    rewards: Tensor, *, group_size: int, std_normalize: bool, std_floor: float
) -> Tensor:
    """GRPO / Dr. GRPO scalar advantages ``[B]`` (float64).

    GRPO (DeepSeekMath, arXiv 2402.03300 §4.1.2): ``(r - mean_g) / std_g`` with the unbiased
    group std (verl/TRL convention). Dr. GRPO (arXiv 2503.20783): ``r - mean_g``
    (``std_normalize=False``). Groups with ``std_g <= std_floor`` get 0. A group of one has no
    baseline and gets 0.

    Raises ``ValueError`` when ``rewards`` is not [B] with B a multiple of ``group_size``.
    """
    grouped = _grouped(rewards, group_size)
    mean = grouped.mean(dim=1, keepdim=True)
    std = _group_std(grouped)
    keep = std > std_floor
    centred = grouped - mean
    scaled = centred / torch.where(keep, std, torch.ones_like(std)) if std_normalize else centred
    return torch.where(keep, scaled, torch.zeros_like(scaled)).view(-1)


def rloo_advantages(rewards: Tensor, *, group_size: int, std_floor: float) -> Tensor:
    """RLOO scalar advantages ``[B]`` (float64): ``r_i - mean_{j != i} r_j``.

    Equals ``n/(n-1) · (r_i - mean_g)`` (Ahmadian et al., arXiv 2402.14740). Groups with
    ``std_g <= std_floor`` get 0. Raises ``ValueError`` for ``group_size < 2`` (no
    leave-one-out baseline) or a batch that does not split into groups.
    """
    if group_size < 2:
        raise ValueError(f"RLOO needs group_size >= 2 (leave-one-out baseline), got {group_size}")
    grouped = _grouped(rewards, group_size)
    loo_mean = (grouped.sum(dim=1, keepdim=True) - grouped) / (group_size - 1)
    keep = _group_std(grouped) > std_floor
    return torch.where(keep, grouped - loo_mean, torch.zeros_like(grouped)).view(-1)


def token_reward_sequence(rewards: Tensor, mask: Tensor, token_rewards: Tensor | None) -> Tensor:
    """Per-token rewards ``[B, T]`` (float64): ``token_rewards`` plus the outcome on the last real token."""
    seq = torch.zeros(mask.shape, dtype=torch.float64, device=mask.device)
    if token_rewards is not None:
        seq = seq + token_rewards.to(torch.float64)
    last = last_token_index(mask)
    has_token = last >= 0
    rows = torch.arange(mask.shape[0], device=mask.device)[has_token]
    seq[rows, last[has_token]] += rewards.to(torch.float64)[has_token]
    return seq * mask.to(torch.float64)


def discounted_returns(token_rewards: Tensor, mask: Tensor, *, gamma: float) -> Tensor:
    """Return-to-go ``G_t = r_t + gamma · G_{t+1}`` over real tokens ([B, T], input dtype).

    Padding positions are skipped (the return flows through them unchanged) and are 0 in the
    output. Source: REINFORCE / OpenRLHF ``get_cumulative_returns``.
    """
    check_token_shapes(mask, token_rewards=token_rewards)
    m = mask.to(token_rewards.dtype)
    if gamma == 1.0:  # fast path (GRPO-family default): a reversed cumulative sum
        return (token_rewards * m).flip(1).cumsum(1).flip(1) * m
    returns = torch.zeros_like(token_rewards)
    running = torch.zeros_like(token_rewards[:, 0])
    for t in reversed(range(token_rewards.shape[1])):
        step = token_rewards[:, t] + gamma * running
        running = m[:, t] * step + (1 - m[:, t]) * running
        returns[:, t] = step * m[:, t]
    return returns


def gae_advantages(
    token_rewards: Tensor, values: Tensor, mask: Tensor, *, gamma: float, lam: float
) -> tuple[Tensor, Tensor]:
    """Generalized advantage estimation (Schulman et al., arXiv 1506.02438), un-whitened.

    ``delta_t = r_t + gamma · V_{t+1} - V_t`` and ``A_t = delta_t + gamma · lam · A_{t+1}``, with
    ``V = 0`` after the last real token; padding positions are skipped (verl's
    ``compute_gae_advantage_return``). Returns ``(advantages, returns = advantages + values)``,
    both [B, T] in the input dtype and 0 on padding.
    """
    check_token_shapes(mask, token_rewards=token_rewards, values=values)
    m = mask.to(token_rewards.dtype)
    values = values.to(token_rewards.dtype)
    advantages = torch.zeros_like(token_rewards)
    next_value = torch.zeros_like(token_rewards[:, 0])
    next_adv = torch.zeros_like(token_rewards[:, 0])
    for t in reversed(range(token_rewards.shape[1])):
        delta = token_rewards[:, t] + gamma * next_value - values[:, t]
        adv = delta + gamma * lam * next_adv
        next_value = m[:, t] * values[:, t] + (1 - m[:, t]) * next_value
        next_adv = m[:, t] * adv + (1 - m[:, t]) * next_adv
        advantages[:, t] = adv * m[:, t]
    return advantages, (advantages + values) * m


def compute_advantages(
    rewards: Tensor,
    mask: Tensor,
    *,
    spec: AlgorithmSpec,
    group_size: int,
    values: Tensor | None = None,
    token_rewards: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """Advantages and returns for ``spec.advantage_estimator``; both [B, T] float32, 0 on padding.

    - ``grpo`` / ``dr_grpo`` / ``rloo``: one scalar per response broadcast over its tokens
      (``dr_grpo`` always skips the std division; ``grpo`` divides unless ``spec.std_normalize``
      is False).
    - ``reinforce_pp``: discounted returns whitened over all tokens of the batch (REINFORCE++,
      arXiv 2501.03262); ``reinforce_pp_baseline`` subtracts the group mean reward first.
    - ``gae``: needs ``values`` [B, T] from the critic; advantages whitened over the batch.

    Args: ``rewards`` [B] outcome rewards; ``mask`` [B, T] (1 = real response token);
    ``group_size`` responses per prompt (contiguous); ``token_rewards`` [B, T] optional extra
    per-token rewards (e.g. ``-coef · KL``). Raises ``ValueError`` on shape mismatches, a batch
    that does not split into groups, or ``gae`` without ``values``.
    """
    check_token_shapes(mask, values=values, token_rewards=token_rewards)
    if rewards.shape != mask.shape[:1]:
        raise ValueError(
            f"rewards has shape {tuple(rewards.shape)}, expected [B]=[{mask.shape[0]}] like mask"
        )
    estimator = spec.advantage_estimator
    m = mask.to(torch.float64)
    scores = rewards.to(torch.float64)
    if token_rewards is not None:
        scores = scores + (token_rewards.to(torch.float64) * m).sum(dim=1)
    token_seq = token_reward_sequence(rewards, mask, token_rewards)
    returns = discounted_returns(token_seq, mask, gamma=spec.gamma)

    if estimator in ("grpo", "dr_grpo"):
        scalar = group_normalized_advantages(
            scores,
            group_size=group_size,
            std_normalize=spec.std_normalize and estimator == "grpo",
            std_floor=spec.std_floor,
        )
        advantages = scalar[:, None] * m
    elif estimator == "rloo":
        advantages = (
            rloo_advantages(scores, group_size=group_size, std_floor=spec.std_floor)[:, None] * m
        )
    elif estimator in ("reinforce_pp", "reinforce_pp_baseline"):
        if estimator == "reinforce_pp_baseline":
            grouped = _grouped(rewards, group_size)
            baseline = (grouped - grouped.mean(dim=1, keepdim=True)).view(-1)
            token_seq = token_reward_sequence(baseline, mask, token_rewards)
        centred_returns = discounted_returns(token_seq, mask, gamma=spec.gamma)
        advantages = masked_whiten(centred_returns, mask, std_floor=spec.std_floor)
    elif estimator == "gae":
        if values is None:
            raise ValueError("advantage_estimator=gae needs values [B, T] from the critic")
        raw, returns = gae_advantages(
            token_seq, values.to(torch.float64), mask, gamma=spec.gamma, lam=spec.lam
        )
        advantages = masked_whiten(raw, mask, std_floor=spec.std_floor)
    else:  # pragma: no cover - the spec's Literal makes this unreachable
        raise AssertionError(estimator)
    return advantages.to(torch.float32), returns.to(torch.float32)
