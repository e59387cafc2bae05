"""Training health rules (issue 17 rows 7-8): NaN/inf fail at once naming the metric, a collapse
stops the run after ``patience_steps``, and ``last_healthy_step`` stays on the last good step."""

from __future__ import annotations

import math

import pytest
import torch

from fp8rl.protocol import parse_job_spec
from fp8rl.protocol.health_spec import HealthSpec
from fp8rl.services.health import HealthGuard, RunUnhealthy

V = 49152
LN_V = math.log(V)
ADV = torch.tensor([[0.5, -0.5], [0.0, 0.0]])


def good(**changes: float) -> dict[str, float]:
    metrics = {
        "reward/mean": 0.4,
        "actor/pg_loss": 0.01,
        "actor/kl": 0.0,
        "actor/entropy": 2.0,
        "actor/grad_norm": 0.7,
        "mismatch/kl_k3": 1e-4,
    }
    return metrics | changes


def test_nan_reward_fails_before_the_update_naming_the_reward():
    guard = HealthGuard(HealthSpec(), vocab_size=V)
    with pytest.raises(RunUnhealthy) as info:
        guard.check_rewards(1, torch.tensor([1.0, float("nan"), 0.0, float("nan")]))
    message = str(info.value)
    assert "reward is nan for 2 of 4 responses" in message and "step 1" in message


@pytest.mark.parametrize("name", ["actor/pg_loss", "actor/grad_norm"])
@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_non_finite_loss_or_grad_norm_fails_the_step_at_once(name, value):
    guard = HealthGuard(HealthSpec(patience_steps=5), vocab_size=V)
    guard.check_step(1, good(), ADV)
    with pytest.raises(RunUnhealthy, match=f"{name} is {value}"):
        guard.check_step(2, good(**{name: value}), ADV)
    assert guard.last_healthy_step == 1


def test_entropy_collapse_stops_after_patience_steps_naming_the_metric():
    guard = HealthGuard(HealthSpec(patience_steps=2), vocab_size=V)
    assert guard.check_step(1, good(), ADV).healthy
    collapsed = good(**{"actor/entropy": 0.998 * LN_V})  # lr=1e3: uniform after one update
    assert guard.check_step(2, collapsed, ADV).signals  # one step: a signal, not yet a failure
    with pytest.raises(RunUnhealthy) as info:
        guard.check_step(3, collapsed, ADV)
    assert "actor/entropy" in str(info.value) and "for 2 steps" in str(info.value)
    assert guard.last_healthy_step == 1  # the checkpoint after step 1 is the last healthy one


def test_collapse_to_a_deterministic_policy_stops_the_run():
    # quickstart with trainer.lr=1e3 (measured on CPU): entropy 2.05 -> 0.065 -> 0.0, reward 0,
    # grad_norm 0 with all advantages 0 (every group scored the same), so no dead-gradient signal
    guard = HealthGuard(HealthSpec(patience_steps=2), vocab_size=V)
    zero = torch.zeros(4, 3)
    guard.check_step(1, good(**{"actor/entropy": 2.05}), ADV)
    after = {"reward/mean": 0.0, "actor/grad_norm": 0.0}
    assert guard.check_step(2, good(**after, **{"actor/entropy": 0.065}), zero).signals
    with pytest.raises(RunUnhealthy, match=r"actor/entropy 0 < health\.min_entropy=0\.1 "):
        guard.check_step(3, good(**after, **{"actor/entropy": 0.0}), zero)
    assert guard.last_healthy_step == 1  # the checkpoint after step 1 stays the healthy one


def test_a_signal_that_clears_resets_its_streak():
    guard = HealthGuard(HealthSpec(patience_steps=2), vocab_size=V)
    guard.check_step(1, good(), ADV)
    guard.check_step(2, good(**{"mismatch/kl_k3": 5.0}), ADV)
    assert guard.check_step(3, good(), ADV).healthy
    assert guard.check_step(4, good(**{"mismatch/kl_k3": 5.0}), ADV).signals
    assert guard.last_healthy_step == 3  # steps are numbered from 1


def test_dead_gradient_with_nonzero_advantages_is_a_signal_but_zero_advantages_are_not():
    guard = HealthGuard(HealthSpec(patience_steps=1), vocab_size=V)
    assert guard.check_step(1, good(**{"actor/grad_norm": 0.0}), torch.zeros(2, 2)).healthy
    with pytest.raises(RunUnhealthy, match=r"actor/grad_norm is 0 while advantages reach 0\.5"):
        guard.check_step(2, good(**{"actor/grad_norm": 0.0}), ADV)


def test_a_policy_that_starts_near_uniform_is_not_judged_by_entropy():
    guard = HealthGuard(HealthSpec(patience_steps=1), vocab_size=V)  # a random-init model
    for step in range(3):
        assert guard.check_step(step, good(**{"actor/entropy": 0.999 * LN_V}), ADV).healthy


def test_warn_action_logs_and_continues_without_advancing_the_healthy_step(caplog):
    guard = HealthGuard(HealthSpec(action="warn", patience_steps=1), vocab_size=V)
    guard.check_step(1, good(), ADV)
    health = guard.check_step(2, good(**{"actor/pg_loss": float("nan")}), ADV)
    assert not health.healthy and guard.last_healthy_step == 1
    assert "health.action=warn" in caplog.text


def test_thresholds_are_in_the_spec_and_named_on_error():
    job = parse_job_spec("health: {patience_steps: 4, max_mismatch_kl: 0.5}")
    assert job.health.patience_steps == 4 and job.health.max_mismatch_kl == 0.5
    with pytest.raises(ValueError, match=r"health\.entropy_collapse_fraction"):
        parse_job_spec("health: {entropy_collapse_fraction: 1.5}")


def test_a_policy_converged_on_rewarded_answers_is_not_a_collapse():
    # the quickstart resumed to step 16: entropy 0.072 with reward/mean ~0.9 (measured)
    guard = HealthGuard(HealthSpec(patience_steps=1), vocab_size=V)
    converged = good(**{"actor/entropy": 0.072, "reward/mean": 0.9})
    assert guard.check_step(1, converged, ADV).healthy
