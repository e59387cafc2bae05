"""The health guard of the training loop: stop a run that stopped learning, naming why.

The driver asks ``HealthGuard`` twice per step: ``check_rewards`` right after scoring (a NaN
reward must not reach the update) and ``check_step`` with the step's metrics and advantages.
With ``health.action=fail`` an unhealthy step raises ``RunUnhealthy`` (the run ends FAILED with
that reason); with ``warn`` it is logged. ``last_healthy_step`` is the completed-step count of the
last step with no signal at all, i.e. the number its checkpoint carries: checkpoints after it
must never replace it (the checkpointer's prune rule reads it from the guard).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass, field

import torch
from torch import Tensor

from fp8rl.protocol.health_spec import HealthSpec

log = logging.getLogger("fp8rl.health")

FINITE_METRICS = ("reward/mean", "actor/pg_loss", "actor/kl", "actor/entropy", "actor/grad_norm")
"""Metrics that must be finite (when ``health.nonfinite``)."""


class RunUnhealthy(RuntimeError):
    """A health rule failed; the message names the metric, the value and the rule."""


@dataclass
class StepHealth:
    """Verdict of one step: ``problems`` (unhealthy now) and ``signals`` (collapse signals held)."""

    step: int
    problems: list[str] = field(default_factory=list)
    signals: dict[str, str] = field(default_factory=dict)

    @property
    def healthy(self) -> bool:
        """No problem and no collapse signal this step."""
        return not self.problems and not self.signals


def nonfinite_problems(values: Mapping[str, float]) -> list[str]:
    """``name is nan`` for each of ``FINITE_METRICS`` present in ``values`` and not finite."""
    return [
        f"{name} is {values[name]} (health.nonfinite)"
        for name in FINITE_METRICS
        if name in values and not math.isfinite(values[name])
    ]


def near_uniform(entropy: float, vocab_size: int, fraction: float) -> bool:
    """Whether ``entropy`` (nats/token) is within ``fraction`` of ln(``vocab_size``); 0 = never."""
    return fraction > 0 and entropy >= (1 - fraction) * math.log(vocab_size)


def collapse_signals(
    metrics: Mapping[str, float], advantages: Tensor | None, spec: HealthSpec, vocab_size: int
) -> dict[str, str]:
    """Collapse signals of one step, by rule (``entropy_uniform``, ``entropy_zero``,
    ``dead_gradient``, ``mismatch``) → a description naming the metric.

    Args:
        metrics: the step's metrics (``actor/entropy`` in nats/token, ``actor/grad_norm``,
            ``mismatch/kl_k3``); absent ones are not judged.
        advantages: [B, T] float advantages of the batch (None: the dead-gradient rule is off).
        vocab_size: the policy's vocabulary size V (entropy of a uniform policy is ln V).
    """
    out = {}
    entropy = metrics.get("actor/entropy")
    uniform = math.log(vocab_size)
    if entropy is not None and near_uniform(entropy, vocab_size, spec.entropy_collapse_fraction):
        out["entropy_uniform"] = (
            f"actor/entropy {entropy:.4g} is within {spec.entropy_collapse_fraction:.0%} of "
            f"ln V = {uniform:.4g} (a near-uniform policy; health.entropy_collapse_fraction)"
        )
    reward = metrics.get("reward/mean")
    if entropy is not None and entropy < spec.min_entropy and (reward is None or reward <= 0):
        # A policy that converged on rewarded answers is deterministic too: only an unrewarded
        # deterministic policy (as after a destructive update) is a collapse.
        out["entropy_zero"] = (
            f"actor/entropy {entropy:.3g} < health.min_entropy={spec.min_entropy:g} with "
            f"reward/mean {reward if reward is not None else 'n/a'} (a deterministic policy that "
            "earns nothing: entropy collapse)"
        )
    grad_norm = metrics.get("actor/grad_norm")
    if spec.dead_gradient and grad_norm == 0 and advantages is not None:
        largest = float(advantages.abs().max()) if advantages.numel() else 0.0
        if largest > 0:
            out["dead_gradient"] = (
                f"actor/grad_norm is 0 while advantages reach {largest:.3g} (health.dead_gradient)"
            )
    kl = metrics.get("mismatch/kl_k3")
    if spec.max_mismatch_kl is not None and kl is not None and kl > spec.max_mismatch_kl:
        out["mismatch"] = (
            f"mismatch/kl_k3 {kl:.4g} > health.max_mismatch_kl={spec.max_mismatch_kl:g}"
        )
    return out


class HealthGuard:
    """Evaluates each step against a ``HealthSpec`` and tracks ``last_healthy_step``."""

    def __init__(self, spec: HealthSpec, *, vocab_size: int, start: int = 0) -> None:
        """``start``: steps already done (a resumed run counts them healthy: it resumed from them)."""
        self.spec, self.vocab_size = spec, vocab_size
        self.last_healthy_step = start
        self._streaks: dict[str, int] = {}
        self._judge_entropy: bool | None = None  # decided at the first step with an entropy

    def check_rewards(self, step: int, rewards: Tensor) -> None:
        """Fail before the update when a reward is NaN/inf. ``rewards``: [N] float."""
        if not self.spec.nonfinite:
            return
        bad = ~torch.isfinite(rewards)
        if bool(bad.any()):
            example = float(rewards[bad][0])
            self._act(
                StepHealth(
                    step,
                    [
                        f"reward is {example} for {int(bad.sum())} of {rewards.numel()} responses "
                        "(health.nonfinite; a reward function returned a non-finite value)"
                    ],
                )
            )

    def check_step(
        self, step: int, metrics: Mapping[str, float], advantages: Tensor | None
    ) -> StepHealth:
        """Judge step ``step`` (numbered from 1, as everywhere) from its metrics; raises ``RunUnhealthy`` when it fails
        and ``action=fail``."""
        health = StepHealth(step)
        if self.spec.nonfinite:
            health.problems += nonfinite_problems(metrics)
        health.signals = collapse_signals(metrics, advantages, self.spec, self.vocab_size)
        if not self._entropy_judged(metrics):
            health.signals.pop("entropy_uniform", None)
        self._streaks = {name: self._streaks.get(name, 0) + 1 for name in health.signals}
        for name, streak in self._streaks.items():
            if streak >= self.spec.patience_steps:
                health.problems.append(
                    f"{health.signals[name]} for {streak} steps (health.patience_steps="
                    f"{self.spec.patience_steps})"
                )
        if health.healthy:
            self.last_healthy_step = step
        elif health.problems:
            self._act(health)
        return health

    def _entropy_judged(self, metrics: Mapping[str, float]) -> bool:
        """Collapse means *becoming* uniform: a policy that starts near uniform (a randomly
        initialised model) is not judged by entropy."""
        entropy = metrics.get("actor/entropy")
        if self._judge_entropy is None and entropy is not None:
            frac = self.spec.entropy_collapse_fraction
            self._judge_entropy = not near_uniform(entropy, self.vocab_size, frac)
            if not self._judge_entropy:
                log.info("entropy starts near ln V (a random model?): entropy collapse not judged")
        return bool(self._judge_entropy)

    def _act(self, health: StepHealth) -> None:
        reason = (
            f"unhealthy at step {health.step}: {'; '.join(health.problems)}; last healthy "
            f"checkpoint step {self.last_healthy_step}"
        )
        if self.spec.action == "fail":
            raise RunUnhealthy(reason)
        log.warning("%s (health.action=warn: continuing)", reason)
