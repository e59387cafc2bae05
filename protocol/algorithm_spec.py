"""RL algorithm settings: advantage estimator, policy loss, KL, rollout correction, DAPO options."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from fp8rl.protocol.base import StrictModel


class KLSpec(StrictModel):
    """KL divergence to the reference policy."""

    coef: float = Field(default=0.0, ge=0)
    """Weight of the KL term (0 = off, no reference worker needed)."""

    estimator: Literal["k1", "k2", "k3"] = "k3"
    """Per-token estimator (Schulman's k1/k2/k3; k3 = r - 1 - log r with r = p_ref/p)."""

    use: Literal["loss", "reward"] = "loss"
    """Add the KL as a loss term (GRPO) or subtract it from the reward (PPO/RLHF style)."""

    clamp: float | None = Field(default=10.0, gt=0)
    """Bound on each token's KL estimate, clamped to [-clamp, clamp] (None = no bound). 10 is
    verl's (``low_var_kl``) and NeMo RL's value: without it one token far outside the
    reference's support gives k3 ≈ exp(20) ≈ 5e8 and swamps the loss."""


class RolloutCorrectionSpec(StrictModel):
    """Importance-sampling corrections for rollout/trainer mismatch (a no-op when the two agree)."""

    method: Literal["none", "tis", "mis", "icepop", "seq_mask"] = "none"
    """``tis``: truncate the IS weight at ``threshold_high``; ``mis``: mask tokens whose weight leaves
    [threshold_low, threshold_high]; ``icepop``: mask like MIS at token level; ``seq_mask``: drop
    sequences whose token_mult_prob_error exceeds ``threshold_high``."""

    level: Literal["token", "sequence"] = "token"
    """Compute the IS weight per token or per sequence (product over tokens)."""

    threshold_low: float = Field(default=0.5, ge=0)
    """Lower bound of the accepted IS weight (MIS/IcePop)."""

    threshold_high: float = Field(default=2.0, gt=0)
    """Upper bound (TIS truncation, MIS/IcePop mask, seq_mask error limit)."""

    @model_validator(mode="after")
    def _weight_one_is_accepted(self) -> RolloutCorrectionSpec:
        if not self.threshold_low <= 1.0 <= self.threshold_high:
            raise ValueError(
                f"rollout_correction thresholds [{self.threshold_low}, {self.threshold_high}] must "
                "contain 1.0: when rollout and trainer agree (IS weight 1, mult-prob error 1) the "
                "correction must be a no-op (threshold_low <= 1 <= threshold_high)"
            )
        return self


class AlgorithmSpec(StrictModel):
    """How advantages and the policy loss are computed."""

    advantage_estimator: Literal[
        "grpo", "dr_grpo", "rloo", "reinforce_pp", "reinforce_pp_baseline", "gae"
    ] = "grpo"
    """Advantage estimator. ``gae`` needs a critic (PPO)."""

    policy_loss: Literal["ppo_clip", "gspo"] = "ppo_clip"
    """``ppo_clip``: token-level clipped ratio; ``gspo``: sequence-level (length-normalised) ratio."""

    clip_ratio_low: float = Field(default=0.2, gt=0, lt=1)
    """Lower PPO clip: the ratio is clipped at 1 - clip_ratio_low."""

    clip_ratio_high: float = Field(default=0.2, gt=0)
    """Upper PPO clip: 1 + clip_ratio_high (DAPO clip-higher uses 0.28)."""

    dual_clip_c: float | None = Field(default=None, gt=1)
    """Dual-clip PPO (Ye et al. 2020, arXiv 1912.09729): for negative advantages the per-token
    loss is capped at ``-A · c`` so that a huge ratio cannot give an unbounded loss. None = off;
    verl's default is 3.0 (``clip_ratio_c``). Must be > 1. ``ppo_clip`` only."""

    loss_agg: Literal["token_mean", "seq_mean_token_sum", "seq_mean_token_mean"] = "token_mean"
    """How per-token losses are reduced to a scalar. GSPO needs a sequence-level one
    (``seq_mean_token_mean`` is the paper's objective)."""

    std_normalize: bool = True
    """Divide group-centred rewards by the group std (GRPO); off for Dr. GRPO."""

    std_floor: float = Field(default=1e-3, ge=0)
    """Groups whose reward std is below this get zero advantages (no amplification of noise)."""

    kl: KLSpec = Field(default_factory=KLSpec)
    """KL to the reference policy."""

    entropy_coef: float = Field(default=0.0, ge=0)
    """Weight of the entropy bonus."""

    rollout_correction: RolloutCorrectionSpec = Field(default_factory=RolloutCorrectionSpec)
    """Importance-sampling correction between rollout and trainer logprobs."""

    dynamic_sampling: bool = False
    """DAPO: drop groups whose rewards are all equal and sample more prompts to refill the batch."""

    max_resample_rounds: int = Field(default=4, ge=1)
    """Dynamic sampling gives up refilling after this many extra rollout rounds."""

    overlong_buffer: int = Field(default=0, ge=0)
    """DAPO soft overlong penalty: length window (tokens) before max_tokens where it ramps up (0 = off)."""

    overlong_penalty: float = Field(default=1.0, ge=0)
    """Penalty reached at max_tokens by the soft overlong punishment."""

    gamma: float = Field(default=1.0, ge=0, le=1)
    """Discount (GAE, REINFORCE++)."""

    lam: float = Field(default=1.0, ge=0, le=1)
    """GAE lambda."""

    value_clip: float = Field(default=0.2, gt=0)
    """PPO value-loss clip range (critic)."""

    critic_lr: float = Field(default=1e-5, gt=0)
    """Critic learning rate (GAE only)."""

    max_off_policy_steps: int = Field(default=0, ge=0)
    """Accept rollout batches generated this many policy versions behind the trainer (0: on-policy)."""

    @model_validator(mode="after")
    def _check_thresholds(self) -> AlgorithmSpec:
        rc = self.rollout_correction
        if rc.threshold_low >= rc.threshold_high:
            raise ValueError(
                "rollout_correction.threshold_low must be below rollout_correction.threshold_high"
            )
        if self.policy_loss == "gspo" and self.loss_agg == "token_mean":
            raise ValueError(
                "algorithm.policy_loss=gspo needs a sequence-level loss_agg: GSPO's objective "
                "averages the sequence ratio over sequences (arXiv 2507.18071, eq. 5); set "
                "algorithm.loss_agg=seq_mean_token_mean (or seq_mean_token_sum)"
            )
        if self.dual_clip_c is not None and self.policy_loss != "ppo_clip":
            raise ValueError("algorithm.dual_clip_c applies to policy_loss=ppo_clip only")
        return self
