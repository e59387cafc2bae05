"""rl_objective: the per-micro-batch loss the trainer calls."""

from __future__ import annotations

import math

import pytest
import torch

from fp8rl.protocol import AlgorithmSpec
from fp8rl.workers.algorithms import loss_denominator, rl_objective


def test_objective_combines_pg_k3_kl_and_entropy_by_hand():
    # ratio 1, A = [1, -1] -> pg = mean(-1, 1) = 0; log(pi/pi_ref) = 1 -> k3 = e^-1;
    # entropy [2, 4] -> 3; loss = 0 + 0.1·e^-1 - 0.01·3
    logp = torch.tensor([[-1.0, -1.0]], requires_grad=True)
    spec = AlgorithmSpec(kl={"coef": 0.1}, entropy_coef=0.01)
    loss, metrics = rl_objective(
        logp,
        logp.detach(),
        torch.tensor([[1.0, -1.0]]),
        torch.ones(1, 2),
        spec=spec,
        ref_logp=torch.tensor([[-2.0, -2.0]]),
        entropy=torch.tensor([[2.0, 4.0]]),
    )
    assert loss.item() == pytest.approx(0.1 * math.exp(-1) - 0.03, abs=1e-7)
    assert metrics["actor/pg_loss"] == pytest.approx(0.0)
    assert metrics["actor/kl"] == pytest.approx(math.exp(-1))
    assert metrics["actor/entropy"] == pytest.approx(3.0)
    assert metrics["actor/pg_clipfrac"] == 0.0
    loss.backward()
    assert logp.grad is not None and torch.isfinite(logp.grad).all()


def _batch(seed: int):
    gen = torch.Generator().manual_seed(seed)
    old = -torch.rand(8, 6, generator=gen) * 3
    logp = (old + 0.3 * torch.randn(8, 6, generator=gen)).requires_grad_()
    mask = (torch.arange(6)[None, :] < torch.randint(1, 7, (8, 1), generator=gen)).float()
    adv = torch.randn(8, 1, generator=gen).expand(8, 6) * mask
    ref = old - 0.2 * torch.rand(8, 6, generator=gen)
    return logp, old, adv, mask, ref


@pytest.mark.parametrize(
    ("agg", "policy_loss"),
    [
        ("token_mean", "ppo_clip"),
        ("seq_mean_token_sum", "ppo_clip"),
        ("seq_mean_token_mean", "ppo_clip"),
        ("seq_mean_token_sum", "gspo"),
        ("seq_mean_token_mean", "gspo"),
    ],
)
def test_gradient_accumulation_equals_full_batch(agg, policy_loss):
    logp, old, adv, mask, ref = _batch(0)
    spec = AlgorithmSpec(loss_agg=agg, policy_loss=policy_loss, kl={"coef": 0.05})
    full, _ = rl_objective(logp, old, adv, mask, spec=spec, ref_logp=ref)
    (full_grad,) = torch.autograd.grad(full, logp)
    denominator = loss_denominator(mask, mode=agg)
    micro_total = 0.0
    for part in (slice(0, 3), slice(3, 8)):
        micro, _ = rl_objective(
            logp[part],
            old[part],
            adv[part],
            mask[part],
            spec=spec,
            ref_logp=ref[part],
            loss_denominator=denominator,
        )
        micro_total = micro_total + micro
    (micro_grad,) = torch.autograd.grad(micro_total, logp)
    torch.testing.assert_close(micro_total, full)
    torch.testing.assert_close(micro_grad, full_grad)


@pytest.mark.parametrize("method", ["tis", "mis", "icepop", "seq_mask"])
def test_rollout_correction_is_noop_in_objective_when_rollout_equals_trainer(method):
    logp, old, adv, mask, _ = _batch(1)
    plain, _ = rl_objective(logp, old, adv, mask, spec=AlgorithmSpec())
    spec = AlgorithmSpec(rollout_correction={"method": method})
    corrected, metrics = rl_objective(logp, old, adv, mask, spec=spec, rollout_logp=old.clone())
    assert torch.equal(corrected, plain)
    assert metrics["rollout_corr/mask_frac"] == 0.0 and metrics["rollout_corr/clip_frac"] == 0.0


def test_rollout_correction_reweights_tokens_when_rollout_differs():
    logp = torch.zeros(1, 2, requires_grad=True)
    spec = AlgorithmSpec(rollout_correction={"method": "tis", "threshold_high": 2.0})
    # rollout logp = log(1/3) on token 0: w = 3 -> truncated 2; pg = mean(-2, -1) = -1.5
    loss, metrics = rl_objective(
        logp,
        torch.zeros(1, 2),
        torch.ones(1, 2),
        torch.ones(1, 2),
        spec=spec,
        rollout_logp=torch.tensor([[math.log(1 / 3), 0.0]]),
    )
    assert loss.item() == pytest.approx(-1.5)
    assert metrics["rollout_corr/clip_frac"] == pytest.approx(0.5)


def test_objective_names_missing_inputs():
    logp, old, adv, mask, _ = _batch(2)
    with pytest.raises(ValueError, match="ref_logp"):
        rl_objective(logp, old, adv, mask, spec=AlgorithmSpec(kl={"coef": 0.1}))
    with pytest.raises(ValueError, match="rollout_logp"):
        rl_objective(logp, old, adv, mask, spec=AlgorithmSpec(rollout_correction={"method": "tis"}))
    with pytest.raises(ValueError, match="entropy"):
        rl_objective(logp, old, adv, mask, spec=AlgorithmSpec(entropy_coef=0.01))
