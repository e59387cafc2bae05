"""Reward functions and how truncated responses are scored."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from fp8rl.protocol.base import StrictModel

BUILTIN_REWARDS = ("arithmetic", "gsm8k", "gsm8k_flexible", "math", "format")
"""Reward functions resolvable by name; anything with a dot is a ``module:function`` or dotted path."""


class RewardFnSpec(StrictModel):
    """One reward term; the total reward is the weighted sum of all terms."""

    name: str = "arithmetic"
    """A built-in name (BUILTIN_REWARDS) or a dotted path ``package.module.function``."""

    weight: float = 1.0
    """Multiplier of this term in the total reward."""

    kwargs: dict[str, Any] = Field(default_factory=dict)
    """Extra keyword arguments given to the function."""


class RemoteRewardSpec(StrictModel):
    """A reward model served over HTTP (POST JSON {prompt, response, answer} → {reward})."""

    url: str
    """Endpoint URL."""

    timeout_s: float = Field(default=30.0, gt=0)
    """Per-request timeout."""

    max_retries: int = Field(default=3, ge=0)
    """Retries on timeouts and 5xx, with exponential backoff."""

    backoff_s: float = Field(default=0.5, ge=0)
    """Wait before the first retry; doubled after each further retry."""

    max_concurrency: int = Field(default=8, ge=1)
    """Requests in flight at once from one reward worker."""

    weight: float = 1.0
    """Multiplier of this term in the total reward."""


class RewardSpec(StrictModel):
    """Scoring of responses."""

    functions: list[RewardFnSpec] = Field(default_factory=lambda: [RewardFnSpec()])
    """Reward terms, summed with their weights (one term per function name)."""

    remote: RemoteRewardSpec | None = None
    """Optional remote reward model, added to the sum."""

    truncated: Literal["score", "zero", "penalty"] = "score"
    """A response cut at max_tokens: score it as is, give it 0, or give it ``truncated_penalty``."""

    truncated_penalty: float = -1.0
    """Reward of a truncated response when ``truncated=penalty``."""

    timeout_s: float = Field(default=10.0, gt=0)
    """Wall-time bound of one call of ``math`` (math-verify) or of a custom function, each run in a
    child process that is killed on timeout; the term then scores ``failure_reward``."""

    failure_reward: float = 0.0
    """Value of a term whose call timed out or raised (counted in ``reward/timeouts``/``reward/errors``)."""

    max_failure_fraction: float = Field(default=0.5, ge=0, le=1)
    """The run fails, naming the cause, when more than this fraction of a batch's responses had a
    term time out or raise."""

    num_workers: int = Field(default=1, ge=0)
    """Reward actors; a batch is split into contiguous shares, one per actor, and
    ``max_failure_fraction`` applies to each share. 0: score in the driver process (verl's way for
    rule-based rewards; saves the actor's process, ~0.08 GB on CPU)."""

    verifier_processes: int = Field(default=1, ge=1)
    """Child processes per reward worker running math-verify (each call bounded by ``timeout_s``)."""

    @model_validator(mode="after")
    def _something_scores(self) -> RewardSpec:
        if not self.functions and self.remote is None:
            raise ValueError(
                "functions is empty and remote is not set, so every response would score 0 and "
                "nothing would be learned: list at least one function (e.g. {name: arithmetic}) "
                "or set remote"
            )
        return self

    @field_validator("functions")
    @classmethod
    def _distinct_names(cls, value: list[RewardFnSpec]) -> list[RewardFnSpec]:
        names = [term.name for term in value]
        duplicates = sorted({name for name in names if names.count(name) > 1})
        if duplicates:
            raise ValueError(
                f"reward function(s) {', '.join(duplicates)} listed twice; terms are logged by "
                "name, so list each function once (combine weights into one term)"
            )
        return value
