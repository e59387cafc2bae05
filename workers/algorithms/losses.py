"""Policy losses (PPO-clip with asymmetric clip, GSPO), the clipped value loss, and loss aggregation.

Per-token losses are returned un-reduced ([B, T]) and reduced by ``aggregate_loss`` so the
aggregation is one explicit choice (the Dr. GRPO paper shows the reduction is part of the
algorithm: token_mean is DAPO's token-level loss, seq_mean_token_mean is the original GRPO's,
seq_mean_token_sum drops the length normalisation as Dr. GRPO does).

Gradient accumulation: a micro-batch's loss must use the denominator of the whole mini-batch,
or the sum over micro-batches is not the full-batch loss (long sequences get over/under-weighted).
``loss_denominator(full_mask, mode=...)`` computes it once; pass it to every micro-batch's
``aggregate_loss`` and the summed micro losses (and gradients) equal the full-batch ones exactly.
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor

from fp8rl.workers.algorithms.kl import LOG_RATIO_CLAMP
from fp8rl.workers.algorithms.masking import check_token_shapes, masked_mean, masked_sum

LossAgg = Literal["token_mean", "seq_mean_token_sum", "seq_mean_token_mean"]


def loss_denominator(mask: Tensor, *, mode: LossAgg) -> float:
    """Denominator of ``aggregate_loss`` over a whole mini-batch: tokens or non-empty sequences.

    ``token_mean``: number of real tokens; the two ``seq_mean_*`` modes: number of sequences with
    at least one real token. Returns at least 1.0 (an empty batch reduces to 0, not NaN).
    """
    if mode == "token_mean":
        count = mask.to(torch.float64).sum()
    elif mode in ("seq_mean_token_sum", "seq_mean_token_mean"):
        count = (mask.to(torch.float64).sum(dim=1) > 0).sum()
    else:
        raise ValueError(
            f"unknown loss_agg {mode!r}; use token_mean, seq_mean_token_sum or seq_mean_token_mean"
        )
    return max(float(count), 1.0)


def aggregate_loss(
    token_loss: Tensor, mask: Tensor, *, mode: LossAgg, denominator: float | None = None
) -> Tensor:
    """Reduce a per-token loss [B, T] to a scalar.

    - ``token_mean``: ``sum_{i,t} l·m / N_tokens``
    - ``seq_mean_token_sum``: ``sum_i (sum_t l·m) / N_seqs`` (no length normalisation)
    - ``seq_mean_token_mean``: ``sum_i (sum_t l·m / len_i) / N_seqs``

    ``denominator`` (N_tokens or N_seqs of the whole mini-batch, see ``loss_denominator``)
    replaces the local count so that micro-batch losses add up to the full-batch loss. Raises
    ``ValueError`` for an unknown mode, a non-positive denominator or shape mismatches.
    """
    check_token_shapes(mask, token_loss=token_loss)
    if denominator is None:
        denominator = loss_denominator(mask, mode=mode)
    elif denominator <= 0:
        raise ValueError(f"loss_denominator must be > 0, got {denominator}")
    m = mask.to(token_loss.dtype)
    if mode == "token_mean":
        return masked_sum(token_loss, m) / denominator
    per_seq = masked_sum(token_loss, m, dim=1)
    if mode == "seq_mean_token_mean":
        per_seq = per_seq / m.sum(dim=1).clamp(min=1)
    elif mode != "seq_mean_token_sum":
        raise ValueError(
            f"unknown loss_agg {mode!r}; use token_mean, seq_mean_token_sum or seq_mean_token_mean"
        )
    return per_seq.sum() / denominator


def ppo_clip_loss(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    *,
    clip_ratio_low: float,
    clip_ratio_high: float,
    dual_clip_c: float | None = None,
) -> tuple[Tensor, Tensor]:
    """PPO clipped surrogate per token (Schulman et al. 2017) with DAPO's asymmetric clip.

    ``ratio = exp(logp - old_logp)``; loss ``= max(-A·ratio, -A·clip(ratio, 1-low, 1+high))``.
    DAPO's clip-higher (arXiv 2503.14476) is ``clip_ratio_high=0.28`` with ``low=0.2``.
    ``dual_clip_c`` (> 1, dual-clip PPO, arXiv 1912.09729, verl's ``clip_ratio_c``): where
    ``A < 0`` the loss is further capped at ``-A·c`` (``min(that, -A·c)``), so a ratio far above
    1 gives a bounded loss and no gradient. Returns ``(loss [B, T], clipped [B, T] bool)``
    where ``clipped`` marks tokens whose gradient a clip removed. The log ratio is clamped to
    ±20 before ``exp``. Raises ``ValueError`` for ``dual_clip_c <= 1``.
    """
    log_ratio = (logp - old_logp).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    ratio = torch.exp(log_ratio)
    unclipped = -advantages * ratio
    clipped = -advantages * ratio.clamp(1 - clip_ratio_low, 1 + clip_ratio_high)
    loss, was_clipped = torch.maximum(unclipped, clipped), clipped > unclipped
    if dual_clip_c is None:
        return loss, was_clipped
    if dual_clip_c <= 1:
        raise ValueError(f"dual_clip_c must be > 1, got {dual_clip_c}")
    cap = -advantages * dual_clip_c
    dual = (advantages < 0) & (loss > cap)
    return torch.where(dual, cap, loss), was_clipped | dual


def gspo_loss(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    clip_ratio_low: float,
    clip_ratio_high: float,
) -> tuple[Tensor, Tensor]:
    """GSPO per-token loss (Zheng et al., arXiv 2507.18071, the GSPO-token form).

    The sequence ratio ``s_i = exp(mean_t (logp - old_logp))`` (length-normalised) is clipped
    like PPO; each token carries ``s_i · pi/sg(pi)`` so its value is ``s_i`` and its gradient is
    the sequence-level one. Every token of a sequence shares the clip decision. Use small clip
    ranges (the paper: 3e-4 / 4e-4) and a sequence-level ``loss_agg`` (``seq_mean_token_mean``
    is the paper's objective; ``AlgorithmSpec`` refuses ``token_mean`` with GSPO). Returns
    ``(loss [B, T], clipped [B, T] bool)``.
    """
    check_token_shapes(mask, logp=logp, old_logp=old_logp, advantages=advantages)
    m = mask.to(logp.dtype)
    seq_log_ratio = masked_mean((logp - old_logp).detach(), m, dim=1)
    token_log_ratio = logp - logp.detach() + seq_log_ratio[:, None]
    ratio = torch.exp(token_log_ratio.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))
    unclipped = -advantages * ratio
    clipped = -advantages * ratio.clamp(1 - clip_ratio_low, 1 + clip_ratio_high)
    return torch.maximum(unclipped, clipped), clipped > unclipped


def value_loss(
    values: Tensor, old_values: Tensor, returns: Tensor, *, value_clip: float
) -> tuple[Tensor, Tensor]:
    """Clipped critic loss per token (PPO2 / verl ``compute_value_loss``).

    ``v_clip = old + clamp(v - old, -value_clip, value_clip)``; loss
    ``= 0.5 · max((v - R)², (v_clip - R)²)``. Returns ``(loss [B, T], clipped [B, T] bool)``.
    """
    clipped_values = old_values + (values - old_values).clamp(-value_clip, value_clip)
    loss_unclipped = (values - returns).square()
    loss_clipped = (clipped_values - returns).square()
    return 0.5 * torch.maximum(loss_unclipped, loss_clipped), loss_clipped > loss_unclipped
