"""The JobSpec: one YAML file describes a whole run. Each worker receives only its own sub-spec."""

from __future__ import annotations

import re

from pydantic import Field, field_validator, model_validator

from fp8rl.protocol.algorithm_spec import AlgorithmSpec
from fp8rl.protocol.base import StrictModel
from fp8rl.protocol.data_spec import DataSpec
from fp8rl.protocol.health_spec import HealthSpec
from fp8rl.protocol.model_spec import ModelSpec
from fp8rl.protocol.quant import PrecisionSpec
from fp8rl.protocol.reward_spec import RewardSpec
from fp8rl.protocol.rollout_spec import NativeRollout, RolloutSpec
from fp8rl.protocol.run_spec import CheckpointSpec, EvalSpec, LoggingSpec, ResourcesSpec
from fp8rl.protocol.trainer_spec import NativeTrainer, ReferenceSpec, TrainerSpec

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")


class JobSpec(StrictModel):
    """A complete fp8rl run: model, data, engines, algorithm, precision and bookkeeping."""

    name: str = "fp8rl-run"
    """Run name; the run directory is ``output_dir/name``. Letters, digits, ``._-``; not
    containing ``.previous-`` (earlier runs moved aside)."""

    seed: int = Field(default=0, ge=0, lt=2**62)
    """Seed of data order, sampling and initialisation (0 ≤ seed < 2**62, the range the sampling
    streams derive from; torch refuses seeds past 2**63)."""

    steps: int = Field(default=10, ge=1)
    """RL steps (rollout → update → weight sync) to run."""

    output_dir: str = "runs"
    """Parent directory of run directories (metrics, checkpoints, exports)."""

    keep_previous_runs: int = Field(default=1, ge=0)
    """A fresh run moves an earlier run directory of the same name aside to
    ``<name>.previous-<time>``; this many such directories are kept, older ones are deleted
    (0: the earlier run is deleted at once). Only runs that did something count: a failed start
    (no step completed, no checkpoint) is replaced, not moved aside."""

    model: ModelSpec = Field(default_factory=ModelSpec)
    """The policy model."""

    data: DataSpec = Field(default_factory=DataSpec)
    """Training prompts."""

    rollout: RolloutSpec = Field(default_factory=NativeRollout)
    """Rollout engine."""

    trainer: TrainerSpec = Field(default_factory=NativeTrainer)
    """Policy trainer."""

    reference: ReferenceSpec = Field(default_factory=ReferenceSpec)
    """Reference policy (KL)."""

    reward: RewardSpec = Field(default_factory=RewardSpec)
    """Reward functions."""

    algorithm: AlgorithmSpec = Field(default_factory=AlgorithmSpec)
    """Advantages and losses."""

    precision: PrecisionSpec = Field(default_factory=PrecisionSpec)
    """BF16 / FP8 precision flow and the quant contract."""

    resources: ResourcesSpec = Field(default_factory=ResourcesSpec)
    """Placement and devices."""

    logging: LoggingSpec = Field(default_factory=LoggingSpec)
    """Experiment tracking."""

    checkpoint: CheckpointSpec = Field(default_factory=CheckpointSpec)
    """Checkpointing and resume."""

    eval: EvalSpec = Field(default_factory=EvalSpec)
    """Held-out evaluation."""

    health: HealthSpec = Field(default_factory=HealthSpec)
    """Training health rules (NaN/inf, collapse) and what a failing rule does."""

    @field_validator("name")
    @classmethod
    def _check_name(cls, value: str) -> str:
        if not _NAME.match(value):
            raise ValueError("must be 1-64 characters of letters, digits, '.', '_' or '-'")
        if ".previous-" in value:  # the suffix of runs moved aside, which pruning may delete
            raise ValueError(
                "must not contain '.previous-' (the suffix of earlier runs moved aside)"
            )
        return value

    @model_validator(mode="after")
    def _cross_checks(self) -> JobSpec:
        if self.data.max_prompt_tokens + self.rollout.max_tokens > self.model.max_model_len:
            raise ValueError(
                f"data.max_prompt_tokens ({self.data.max_prompt_tokens}) + rollout.max_tokens "
                f"({self.rollout.max_tokens}) exceeds model.max_model_len ({self.model.max_model_len})"
            )
        if (
            self.eval.datasets
            and self.data.max_prompt_tokens + self.eval.max_tokens > self.model.max_model_len
        ):
            raise ValueError(
                f"data.max_prompt_tokens ({self.data.max_prompt_tokens}) + eval.max_tokens "
                f"({self.eval.max_tokens}) exceeds model.max_model_len ({self.model.max_model_len})"
            )
        if self.precision.quant.kv_cache_dtype != "auto" and self.precision.mode != "unified_fp8":
            raise ValueError(
                "precision.quant.kv_cache_dtype=fp8_e4m3 needs precision.mode=unified_fp8 (the trainer "
                "calibrates the KV scales with the same round trip the engines apply)"
            )
        if self.algorithm.advantage_estimator in ("grpo", "dr_grpo", "rloo") and self.rollout.n < 2:
            raise ValueError(
                f"algorithm.advantage_estimator={self.algorithm.advantage_estimator} compares "
                f"responses within a group: rollout.n must be >= 2, got {self.rollout.n}"
            )
        return self

    @property
    def reference_enabled(self) -> bool:
        """Whether a reference worker is needed (explicitly, or because the KL is on)."""
        if self.reference.enabled is not None:
            return self.reference.enabled
        return self.algorithm.kl.coef > 0

    @property
    def batch_size(self) -> int:
        """Sequences per rollout batch: prompts_per_step × n."""
        return self.data.prompts_per_step * self.rollout.n
