"""Advantage estimators against hand-computed examples (numbers written out below)."""

from __future__ import annotations

import math

import pytest
import torch

from fp8rl.protocol import AlgorithmSpec
from fp8rl.workers.algorithms import (
    compute_advantages,
    discounted_returns,
    gae_advantages,
    group_normalized_advantages,
)

SQRT3_2 = math.sqrt(3) / 2


def full_mask(batch: int, length: int = 1) -> torch.Tensor:
    return torch.ones(batch, length)


def test_grpo_normalizes_by_unbiased_group_std_and_zeroes_all_equal_group():
    # group 1: [1, 0, 0, 1]: mean 0.5, unbiased var = 4·0.25/3 = 1/3 -> advantage ±0.5/√(1/3) = ±√3/2
    # group 2: [1, 1, 1, 1]: no signal -> exactly 0
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0, 1.0])
    adv, _ = compute_advantages(rewards, full_mask(8), spec=AlgorithmSpec(), group_size=4)
    expected = torch.tensor([SQRT3_2, -SQRT3_2, -SQRT3_2, SQRT3_2, 0, 0, 0, 0])
    torch.testing.assert_close(adv[:, 0], expected)
    assert torch.all(adv[4:] == 0)


def test_grpo_seven_equal_and_one_different_reward_is_a_real_signal():
    # [0.35 ×7, 0.95]: mean 0.425, deviations -0.075 ×7 and 0.525, unbiased var 0.315/7 = 0.045,
    # std = 3/(10√2) -> advantages -√2/4 and 7√2/4; finite and bounded, equal within the seven.
    rewards = torch.tensor([0.35] * 7 + [0.95], dtype=torch.float32)
    adv, _ = compute_advantages(rewards, full_mask(8), spec=AlgorithmSpec(), group_size=8)
    expected = torch.tensor([-math.sqrt(2) / 4] * 7 + [7 * math.sqrt(2) / 4])
    torch.testing.assert_close(adv[:, 0], expected)
    assert torch.unique(adv[:7]).numel() == 1


def test_grpo_float32_group_of_equal_rewards_gives_exact_zero_not_residue():
    # eight float32 0.35: the float32 mean is not exactly 0.35; stats in float64 make it exact
    rewards = torch.full((8,), 0.35, dtype=torch.float32)
    adv, _ = compute_advantages(
        rewards, full_mask(8, 3), spec=AlgorithmSpec(std_floor=0.0), group_size=8
    )
    assert torch.all(adv == 0)


def test_grpo_float_residue_std_below_floor_gives_zero_not_amplified_noise():
    # rewards equal in exact arithmetic, computed differently: std ~1e-17
    residue = torch.tensor([0.1 + 0.25, 0.35, 0.05 * 7, 0.15 + 0.2] * 2, dtype=torch.float64)
    assert residue.std() > 0
    adv, _ = compute_advantages(residue, full_mask(8), spec=AlgorithmSpec(), group_size=8)
    assert torch.all(adv == 0)
    # std ≈ 1.06e-4 (seven 0.35, one 0.3503): without a floor it becomes ±O(1) advantages
    small = torch.tensor([0.35] * 7 + [0.3503], dtype=torch.float64)
    no_floor = group_normalized_advantages(small, group_size=8, std_normalize=True, std_floor=0.0)
    assert no_floor.abs().max() > 2.0
    adv, _ = compute_advantages(
        small, full_mask(8), spec=AlgorithmSpec(std_floor=1e-3), group_size=8
    )
    assert torch.all(adv == 0) and torch.isfinite(adv).all()


def test_dr_grpo_centres_without_std_division():
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0])  # mean 0.5 -> ±0.5
    adv, _ = compute_advantages(
        rewards, full_mask(4), spec=AlgorithmSpec(advantage_estimator="dr_grpo"), group_size=4
    )
    torch.testing.assert_close(adv[:, 0], torch.tensor([0.5, -0.5, -0.5, 0.5]))


def test_rloo_subtracts_leave_one_out_mean():
    # r=1: 1 - mean(0,0,1) = 2/3; r=0: 0 - mean(1,0,1) = -2/3
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0])
    adv, _ = compute_advantages(
        rewards, full_mask(4), spec=AlgorithmSpec(advantage_estimator="rloo"), group_size=4
    )
    torch.testing.assert_close(adv[:, 0], torch.tensor([2 / 3, -2 / 3, -2 / 3, 2 / 3]))


def test_group_advantages_broadcast_over_real_tokens_and_zero_on_padding():
    rewards = torch.tensor([1.0, 0.0])
    mask = torch.tensor([[1, 1, 1], [1, 0, 0]])
    adv, returns = compute_advantages(rewards, mask, spec=AlgorithmSpec(), group_size=2)
    # two rewards 1, 0: unbiased std √0.5 -> ±0.5/√0.5 = ±√2/2
    h = math.sqrt(2) / 2
    torch.testing.assert_close(adv, torch.tensor([[h, h, h], [-h, 0, 0]]))
    torch.testing.assert_close(returns, torch.tensor([[1.0, 1.0, 1.0], [0.0, 0.0, 0.0]]))


def test_reinforce_pp_whitens_globally_with_and_without_group_baseline():
    rewards = torch.tensor([1.0, 0.0, 1.0, 1.0])
    # no baseline: [1, 0, 1, 1], mean 0.75, biased std √0.1875 -> [1/√3, -√3, 1/√3, 1/√3]
    adv, _ = compute_advantages(
        rewards, full_mask(4), spec=AlgorithmSpec(advantage_estimator="reinforce_pp"), group_size=2
    )
    s = 1 / math.sqrt(3)
    torch.testing.assert_close(adv[:, 0], torch.tensor([s, -3 * s, s, s]))
    # group baseline: [0.5, -0.5, 0, 0], mean 0, biased std √0.125 -> [√2, -√2, 0, 0]
    adv, _ = compute_advantages(
        rewards,
        full_mask(4),
        spec=AlgorithmSpec(advantage_estimator="reinforce_pp_baseline"),
        group_size=2,
    )
    torch.testing.assert_close(adv[:, 0], torch.tensor([math.sqrt(2), -math.sqrt(2), 0.0, 0.0]))


def test_reinforce_pp_with_equal_rewards_everywhere_gives_zero():
    adv, _ = compute_advantages(
        torch.ones(4),
        full_mask(4, 2),
        spec=AlgorithmSpec(advantage_estimator="reinforce_pp"),
        group_size=2,
    )
    assert torch.all(adv == 0)


def test_discounted_returns_put_outcome_on_last_token_and_skip_padding():
    # token rewards [0, 0, 1], gamma 0.5 -> [0.25, 0.5, 1]; padding stays 0
    token_rewards = torch.tensor([[0.0, 0.0, 1.0, 0.0]])
    mask = torch.tensor([[1, 1, 1, 0]])
    torch.testing.assert_close(
        discounted_returns(token_rewards, mask, gamma=0.5), torch.tensor([[0.25, 0.5, 1.0, 0.0]])
    )


def test_undiscounted_returns_sum_future_real_tokens():
    # gamma 1: [1, 2, pad, 3] -> [6, 5, 0, 3]; same as the recursion with gamma just below 1
    token_rewards = torch.tensor([[1.0, 2.0, 9.0, 3.0]], dtype=torch.float64)
    mask = torch.tensor([[1, 1, 0, 1]])
    fast = discounted_returns(token_rewards, mask, gamma=1.0)
    torch.testing.assert_close(fast, torch.tensor([[6.0, 5.0, 0.0, 3.0]], dtype=torch.float64))
    torch.testing.assert_close(discounted_returns(token_rewards, mask, gamma=1 - 1e-12), fast)


def test_gae_matches_hand_computed_recursion():
    # rewards [0, 0, 1], values [0.5, 0.6, 0.7], gamma 0.9, lam 0.5:
    # d2 = 1 - 0.7 = 0.3            A2 = 0.3
    # d1 = 0.9·0.7 - 0.6 = 0.03     A1 = 0.03 + 0.45·0.3   = 0.165
    # d0 = 0.9·0.6 - 0.5 = 0.04     A0 = 0.04 + 0.45·0.165 = 0.11425
    token_rewards = torch.tensor([[0.0, 0.0, 1.0, 0.0]], dtype=torch.float64)
    values = torch.tensor([[0.5, 0.6, 0.7, 9.0]], dtype=torch.float64)  # 9.0 on padding: ignored
    mask = torch.tensor([[1, 1, 1, 0]])
    adv, returns = gae_advantages(token_rewards, values, mask, gamma=0.9, lam=0.5)
    torch.testing.assert_close(adv, torch.tensor([[0.11425, 0.165, 0.3, 0.0]], dtype=torch.float64))
    torch.testing.assert_close(
        returns, torch.tensor([[0.61425, 0.765, 1.0, 0.0]], dtype=torch.float64)
    )


def test_gae_with_gamma_lam_one_is_return_minus_value_and_dispatcher_whitens():
    values = torch.tensor([[0.5, 0.6, 0.7], [0.2, 0.1, 0.0]])
    rewards = torch.tensor([1.0, 0.0])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    spec = AlgorithmSpec(advantage_estimator="gae", gamma=1.0, lam=1.0)
    adv, returns = compute_advantages(rewards, mask, spec=spec, group_size=1, values=values)
    raw = torch.tensor([0.5, 0.4, 0.3, -0.2, -0.1])  # G - V on the 5 real tokens
    expected = (raw - raw.mean()) / raw.std(unbiased=False)
    torch.testing.assert_close(adv[mask.bool()], expected)
    torch.testing.assert_close(returns, torch.tensor([[1.0, 1.0, 1.0], [0.0, 0.0, 0.0]]))


def test_token_rewards_add_to_group_scores():
    # KL-as-reward: scores = rewards + sum of token rewards = [1 - 0.5, 1 + 0] -> group [0.5, 1]
    rewards = torch.tensor([1.0, 1.0])
    token_rewards = torch.tensor([[-0.25, -0.25], [0.0, 0.0]])
    adv, _ = compute_advantages(
        rewards,
        full_mask(2, 2),
        spec=AlgorithmSpec(advantage_estimator="dr_grpo"),
        group_size=2,
        token_rewards=token_rewards,
    )
    torch.testing.assert_close(adv[:, 0], torch.tensor([-0.25, 0.25]))


def test_bad_shapes_and_missing_values_name_the_tensor():
    spec = AlgorithmSpec()
    with pytest.raises(ValueError, match="group_size"):
        compute_advantages(torch.ones(3), full_mask(3), spec=spec, group_size=2)
    with pytest.raises(ValueError, match="rewards"):
        compute_advantages(torch.ones(4), full_mask(3), spec=spec, group_size=1)
    with pytest.raises(ValueError, match="values"):
        compute_advantages(
            torch.ones(2), full_mask(2), spec=AlgorithmSpec(advantage_estimator="gae"), group_size=1
        )
    with pytest.raises(ValueError, match="token_rewards"):
        compute_advantages(
            torch.ones(2), full_mask(2, 2), spec=spec, group_size=2, token_rewards=torch.ones(2, 3)
        )


def test_masked_whiten_uses_the_population_std_of_real_tokens():
    # real tokens 1, 2, 3 (the 100 is padding): mean 2, population var 2/3, std 0.8165
    # (verl's unbiased std would be 1.0 and give -1, 0, 1).
    from fp8rl.workers.algorithms import masked_whiten

    values = torch.tensor([[1.0, 2.0], [3.0, 100.0]])
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    out = masked_whiten(values, mask, std_floor=1e-3)
    s = math.sqrt(2 / 3)
    torch.testing.assert_close(out, torch.tensor([[-1 / s, 0.0], [1 / s, 0.0]]))
