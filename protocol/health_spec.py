"""Training health rules: when a run is no longer learning and must stop (issue 17)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from fp8rl.protocol.base import StrictModel


class HealthSpec(StrictModel):
    """Per-step checks of rewards, loss, gradients, entropy and mismatch.

    A non-finite value is unhealthy at once; a collapse signal (entropy near uniform or near 0, a
    dead gradient, a mismatch blow-up) is unhealthy once it has held ``patience_steps`` steps in a
    row. ``action=fail`` then stops the run FAILED with the metric named.
    """

    action: Literal["fail", "warn"] = "fail"
    """``fail``: stop the run (state FAILED, the reason names the metric); ``warn``: log and go
    on (the last healthy step stays where it was)."""

    nonfinite: bool = True
    """A NaN/inf reward (checked before the update), loss or grad norm is unhealthy."""

    entropy_collapse_fraction: float = Field(default=0.01, ge=0, lt=1)
    """Collapse signal: token entropy (``actor/entropy``) within this fraction of ln(vocab size),
    i.e. a policy close to uniform over the vocabulary. 0 turns the signal off."""

    min_entropy: float = Field(default=0.1, ge=0)
    """Collapse signal: ``actor/entropy`` below this many nats/token while ``reward/mean`` is at
    most 0 (a policy that became deterministic without earning reward, as after a destructive
    update; a policy converged on rewarded answers is not judged). 0 turns the signal off."""

    dead_gradient: bool = True
    """Collapse signal: ``actor/grad_norm`` is 0 while some advantage is non-zero."""

    max_mismatch_kl: float | None = Field(default=1.0, gt=0)
    """Collapse signal: ``mismatch/kl_k3`` (trainer vs rollout, nats/token) above this. None: off."""

    patience_steps: int = Field(default=3, ge=1)
    """Consecutive steps a collapse signal must hold before it is unhealthy."""
