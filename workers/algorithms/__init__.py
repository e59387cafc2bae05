"""RL math as pure tensor functions: advantages, losses, KL/entropy, rollout correction, mismatch.

No Ray, no I/O, no globals: every function takes tensors (response-token aligned [B, T] with a
mask) plus keyword options and returns tensors or plain floats, so it is tested on CPU in
milliseconds and called the same way by any trainer backend.
"""

from fp8rl.workers.algorithms.advantages import (
    compute_advantages,
    discounted_returns,
    gae_advantages,
    group_normalized_advantages,
    rloo_advantages,
)
from fp8rl.workers.algorithms.dapo import dynamic_sampling_keep, overlong_penalty
from fp8rl.workers.algorithms.kl import entropy_from_logits, kl_penalty, kl_reward_penalty
from fp8rl.workers.algorithms.losses import (
    aggregate_loss,
    gspo_loss,
    loss_denominator,
    ppo_clip_loss,
    value_loss,
)
from fp8rl.workers.algorithms.masking import masked_mean, masked_whiten
from fp8rl.workers.algorithms.mismatch import mismatch_by_position, mismatch_metrics
from fp8rl.workers.algorithms.objective import rl_objective
from fp8rl.workers.algorithms.rollout_correction import RolloutCorrection, rollout_correction

__all__ = [
    "RolloutCorrection",
    "aggregate_loss",
    "compute_advantages",
    "discounted_returns",
    "dynamic_sampling_keep",
    "entropy_from_logits",
    "gae_advantages",
    "group_normalized_advantages",
    "gspo_loss",
    "kl_penalty",
    "kl_reward_penalty",
    "loss_denominator",
    "masked_mean",
    "masked_whiten",
    "mismatch_by_position",
    "mismatch_metrics",
    "overlong_penalty",
    "ppo_clip_loss",
    "rl_objective",
    "rloo_advantages",
    "rollout_correction",
    "value_loss",
]
