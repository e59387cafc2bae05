"""Policy/value losses, aggregation, KL and entropy against hand-computed examples."""

from __future__ import annotations

import math

import pytest
import torch

from fp8rl.protocol import AlgorithmSpec, KLSpec
from fp8rl.workers.algorithms import (
    aggregate_loss,
    entropy_from_logits,
    gspo_loss,
    kl_penalty,
    kl_reward_penalty,
    loss_denominator,
    ppo_clip_loss,
    value_loss,
)


def test_ppo_clip_asymmetric_bounds_and_clip_flags():
    # ratios 1.5, 0.5, 1.1, 0.5 with A = 1, 1, -1, -1 and clip (0.2, 0.28):
    # r=1.5,A=1: max(-1.5, -1.28) = -1.28 (clipped)   r=0.5,A=1: max(-0.5, -0.8) = -0.5
    # r=1.1,A=-1: max(1.1, 1.1) = 1.1                  r=0.5,A=-1: max(0.5, 0.8) = 0.8 (clipped)
    old = torch.zeros(1, 4)
    logp = torch.log(torch.tensor([[1.5, 0.5, 1.1, 0.5]]))
    adv = torch.tensor([[1.0, 1.0, -1.0, -1.0]])
    loss, clipped = ppo_clip_loss(logp, old, adv, clip_ratio_low=0.2, clip_ratio_high=0.28)
    torch.testing.assert_close(loss, torch.tensor([[-1.28, -0.5, 1.1, 0.8]]))
    assert clipped.tolist() == [[True, False, False, True]]


def test_ppo_clip_gives_no_gradient_through_clipped_tokens():
    logp = torch.log(torch.tensor([[1.5, 0.9]])).requires_grad_()
    loss, _ = ppo_clip_loss(
        logp, torch.zeros(1, 2), torch.ones(1, 2), clip_ratio_low=0.2, clip_ratio_high=0.2
    )
    loss.sum().backward()
    # d(-ratio)/dlogp = -ratio on the unclipped token (0.9), 0 on the clipped one
    torch.testing.assert_close(logp.grad, torch.tensor([[0.0, -0.9]]))


def test_aggregation_modes_by_hand():
    loss = torch.tensor([[1.0, 2.0, 3.0], [4.0, 9.0, 9.0]])
    mask = torch.tensor([[1, 1, 1], [1, 0, 0]])
    # token_mean: (1+2+3+4)/4 = 2.5; seq_mean_token_sum: (6+4)/2 = 5; seq_mean_token_mean: (2+4)/2 = 3
    assert aggregate_loss(loss, mask, mode="token_mean").item() == pytest.approx(2.5)
    assert aggregate_loss(loss, mask, mode="seq_mean_token_sum").item() == pytest.approx(5.0)
    assert aggregate_loss(loss, mask, mode="seq_mean_token_mean").item() == pytest.approx(3.0)
    assert loss_denominator(mask, mode="token_mean") == 4.0
    assert loss_denominator(mask, mode="seq_mean_token_mean") == 2.0


@pytest.mark.parametrize("mode", ["token_mean", "seq_mean_token_sum", "seq_mean_token_mean"])
def test_micro_batches_with_global_denominator_sum_to_full_batch_loss_and_grad(mode):
    gen = torch.Generator().manual_seed(0)
    values = torch.randn(6, 5, generator=gen, requires_grad=True)
    lengths = torch.tensor([5, 1, 3, 2, 4, 5])
    mask = (torch.arange(5)[None, :] < lengths[:, None]).float()
    full = aggregate_loss(values.square(), mask, mode=mode)
    (full_grad,) = torch.autograd.grad(full, values)
    denominator = loss_denominator(mask, mode=mode)
    micro = sum(
        aggregate_loss(
            values[i : i + 2].square(), mask[i : i + 2], mode=mode, denominator=denominator
        )
        for i in range(0, 6, 2)
    )
    (micro_grad,) = torch.autograd.grad(micro, values)
    torch.testing.assert_close(micro, full)
    torch.testing.assert_close(micro_grad, full_grad)
    # a local denominator per micro-batch would not give the full-batch loss
    local = sum(
        aggregate_loss(values[i : i + 2].square(), mask[i : i + 2], mode=mode)
        for i in range(0, 6, 2)
    )
    assert not torch.isclose(local, full)


def test_empty_mask_aggregates_to_zero_not_nan():
    loss = aggregate_loss(torch.ones(2, 3), torch.zeros(2, 3), mode="seq_mean_token_mean")
    assert loss.item() == 0.0


def test_gspo_uses_length_normalised_sequence_ratio():
    # seq 0: log ratios [0.1, 0.3] -> s = exp(0.2) = 1.2214 > 1.2 -> clipped at 1.2, loss -1.2 per token
    # seq 1: log ratios [-0.1, 0.1] -> s = 1 -> loss -A = -1, gradient -1 per token
    old = torch.zeros(2, 3)
    logp = torch.tensor([[0.1, 0.3, 0.0], [-0.1, 0.1, 0.0]], requires_grad=True)
    mask = torch.tensor([[1, 1, 0], [1, 1, 0]])
    adv = torch.ones(2, 3)
    loss, clipped = gspo_loss(logp, old, adv, mask, clip_ratio_low=0.2, clip_ratio_high=0.2)
    torch.testing.assert_close(loss[:, :2], torch.tensor([[-1.2, -1.2], [-1.0, -1.0]]))
    assert clipped[0, :2].all() and not clipped[1, :2].any()
    (loss * mask).sum().backward()
    torch.testing.assert_close(logp.grad[1, :2], torch.tensor([-1.0, -1.0]))
    assert torch.all(logp.grad[0] == 0)


def test_value_loss_clips_around_old_values():
    # v=1.0, old=0.5, R=1.2, clip 0.2: v_clip=0.7 -> 0.5·max(0.04, 0.25) = 0.125 (clipped)
    # v=0.6, old=0.5, R=1.0: v_clip=0.6 -> 0.5·0.16 = 0.08
    loss, clipped = value_loss(
        torch.tensor([[1.0, 0.6]]),
        torch.tensor([[0.5, 0.5]]),
        torch.tensor([[1.2, 1.0]]),
        value_clip=0.2,
    )
    torch.testing.assert_close(loss, torch.tensor([[0.125, 0.08]]))
    assert clipped.tolist() == [[True, False]]


def test_kl_estimators_by_hand():
    # log(pi/pi_ref) = +1 and -1: k1 = ±1, k2 = 0.5, k3 = e^{-x} - 1 + x = e^-1 and e - 2
    logp = torch.tensor([-1.0, -2.0])
    ref = torch.tensor([-2.0, -1.0])
    torch.testing.assert_close(kl_penalty(logp, ref, estimator="k1"), torch.tensor([1.0, -1.0]))
    torch.testing.assert_close(kl_penalty(logp, ref, estimator="k2"), torch.tensor([0.5, 0.5]))
    torch.testing.assert_close(
        kl_penalty(logp, ref, estimator="k3"), torch.tensor([math.exp(-1), math.e - 2])
    )
    assert torch.all(kl_penalty(logp, logp, estimator="k3") == 0)


def test_kl_reward_penalty_is_negative_scaled_and_masked():
    logp = torch.tensor([[-1.0, -1.0]])
    ref = torch.tensor([[-2.0, -2.0]])
    pen = kl_reward_penalty(
        logp, ref, torch.tensor([[1, 0]]), kl=KLSpec(coef=0.1, estimator="k1", use="reward")
    )
    torch.testing.assert_close(pen, torch.tensor([[-0.1, 0.0]]))


def test_entropy_from_logits_is_stable_and_handles_masked_vocab():
    logits = torch.tensor(
        [
            [0.0, 0.0, -math.inf, -math.inf],
            [0.0, math.log(3.0), -math.inf, -math.inf],
            [1e4, 0.0, 0.0, 0.0],
            [0.0] * 4,
        ]
    )
    # ln 2; -(0.25 ln 0.25 + 0.75 ln 0.75); ~0; ln 4
    expected = torch.tensor(
        [math.log(2), -(0.25 * math.log(0.25) + 0.75 * math.log(0.75)), 0.0, math.log(4)]
    )
    torch.testing.assert_close(entropy_from_logits(logits), expected)
    assert entropy_from_logits(logits.to(torch.bfloat16)).dtype == torch.float32


def test_algorithm_spec_rejects_thresholds_that_exclude_weight_one():
    with pytest.raises(ValueError, match="threshold_high"):
        AlgorithmSpec(rollout_correction={"method": "tis", "threshold_high": 0.9})


def test_dual_clip_caps_negative_advantage_loss_at_c_times_advantage():
    # ratios 5, 5, 2, 0.5 with A = -1, 1, -1, -1, clip 0.2, c = 3:
    # r=5,A=-1: max(5, 1.2) = 5 -> capped at 3        r=5,A=1: max(-5, -1.2) = -1.2 (A > 0: no cap)
    # r=2,A=-1: max(2, 1.2) = 2 < 3 -> 2               r=0.5,A=-1: max(0.5, 0.8) = 0.8
    logp = torch.log(torch.tensor([[5.0, 5.0, 2.0, 0.5]])).requires_grad_()
    adv = torch.tensor([[-1.0, 1.0, -1.0, -1.0]])
    loss, clipped = ppo_clip_loss(
        logp, torch.zeros(1, 4), adv, clip_ratio_low=0.2, clip_ratio_high=0.2, dual_clip_c=3.0
    )
    torch.testing.assert_close(loss, torch.tensor([[3.0, -1.2, 2.0, 0.8]]))
    assert clipped.tolist() == [[True, True, False, True]]
    (grad,) = torch.autograd.grad(loss.sum(), logp)
    assert grad[0, 0] == 0.0 and grad[0, 2] != 0.0


def test_dual_clip_off_by_default_and_refuses_c_at_most_one():
    logp = torch.log(torch.tensor([[5.0]]))
    kwargs = {"clip_ratio_low": 0.2, "clip_ratio_high": 0.2}
    loss, _ = ppo_clip_loss(logp, torch.zeros(1, 1), -torch.ones(1, 1), **kwargs)
    torch.testing.assert_close(loss, torch.tensor([[5.0]]))
    with pytest.raises(ValueError, match="dual_clip_c must be > 1"):
        ppo_clip_loss(logp, torch.zeros(1, 1), -torch.ones(1, 1), dual_clip_c=1.0, **kwargs)
    assert AlgorithmSpec().dual_clip_c is None


def test_kl_clamp_bounds_k3_of_an_off_support_token_at_ten():
    # log pi - log pi_ref = 20: k3 = exp(-20) - 1 + 20 ≈ 19 (unclamped); log ratio -20:
    # k3 = exp(20) - 1 - 20 ≈ 4.85e8 -> 10 with the default clamp.
    logp = torch.tensor([[0.0, -20.0, -0.1]])
    ref = torch.tensor([[-20.0, 0.0, 0.0]])
    raw = kl_penalty(logp, ref, estimator="k3")
    assert raw[0, 1] > 4e8
    clamped = kl_penalty(logp, ref, estimator="k3", clamp=KLSpec().clamp)
    expected_small = math.exp(0.1) - 1 - 0.1
    torch.testing.assert_close(clamped, torch.tensor([[10.0, 10.0, expected_small]]))
    assert KLSpec().clamp == 10.0


def test_kl_reward_penalty_uses_the_spec_clamp():
    logp, ref, mask = torch.tensor([[-20.0]]), torch.tensor([[0.0]]), torch.ones(1, 1)
    bounded = kl_reward_penalty(logp, ref, mask, kl=KLSpec(coef=0.5))
    unbounded = kl_reward_penalty(logp, ref, mask, kl=KLSpec(coef=0.5, clamp=None))
    torch.testing.assert_close(bounded, torch.tensor([[-5.0]]))
    assert unbounded[0, 0] < -1e8


def test_gspo_refuses_token_mean_aggregation_with_a_message():
    with pytest.raises(ValueError, match="seq_mean_token_mean"):
        AlgorithmSpec(policy_loss="gspo")
    assert AlgorithmSpec(policy_loss="gspo", loss_agg="seq_mean_token_mean").loss_agg
    assert AlgorithmSpec(policy_loss="gspo", loss_agg="seq_mean_token_sum").loss_agg
