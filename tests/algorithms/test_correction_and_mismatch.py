"""Rollout correction, mismatch metrics and DAPO helpers against hand-computed examples."""

from __future__ import annotations

import math

import pytest
import torch

from fp8rl.protocol import RolloutCorrectionSpec
from fp8rl.workers.algorithms import (
    dynamic_sampling_keep,
    mismatch_by_position,
    mismatch_metrics,
    overlong_penalty,
    rollout_correction,
)

METHODS = ["none", "tis", "mis", "icepop", "seq_mask"]


@pytest.mark.parametrize("level", ["token", "sequence"])
@pytest.mark.parametrize("method", METHODS)
def test_every_correction_is_exact_noop_when_logprobs_are_bitwise_equal(method, level):
    gen = torch.Generator().manual_seed(1)
    logp = -torch.rand(4, 7, generator=gen) * 5
    mask = (torch.arange(7)[None, :] < torch.tensor([[7], [3], [1], [5]])).float()
    spec = RolloutCorrectionSpec(method=method, level=level, threshold_low=0.9, threshold_high=1.1)
    out = rollout_correction(logp, logp.clone(), mask, spec=spec)
    assert torch.equal(out.weights, mask)  # exactly 1 on real tokens, 0 on padding
    assert torch.equal(out.keep, mask.bool())
    assert out.metrics["rollout_corr/clip_frac"] == 0.0
    assert out.metrics["rollout_corr/mask_frac"] == 0.0
    assert out.metrics["rollout_corr/weight_mean"] == 1.0


def test_tis_truncates_token_weights_at_threshold_high():
    # w = 3, 0.5, 1 with threshold_high 2 -> 2, 0.5, 1; one of three tokens clipped
    old = torch.log(torch.tensor([[3.0, 0.5, 1.0]]))
    out = rollout_correction(
        old, torch.zeros(1, 3), torch.ones(1, 3), spec=RolloutCorrectionSpec(method="tis")
    )
    torch.testing.assert_close(out.weights, torch.tensor([[2.0, 0.5, 1.0]]))
    assert out.metrics["rollout_corr/clip_frac"] == pytest.approx(1 / 3)


def test_sequence_level_tis_uses_product_of_token_ratios():
    # w_seq = 1.5 · 1.5 = 2.25 -> truncated to 2 on both tokens
    old = torch.log(torch.tensor([[1.5, 1.5]]))
    spec = RolloutCorrectionSpec(method="tis", level="sequence")
    out = rollout_correction(old, torch.zeros(1, 2), torch.ones(1, 2), spec=spec)
    torch.testing.assert_close(out.weights, torch.tensor([[2.0, 2.0]]))


def test_mis_masks_tokens_outside_bounds_and_keeps_weight_inside():
    # w = 3, 0.4, 1.5 with [0.5, 2] -> masked, masked, 1.5
    old = torch.log(torch.tensor([[3.0, 0.4, 1.5]]))
    out = rollout_correction(
        old, torch.zeros(1, 3), torch.ones(1, 3), spec=RolloutCorrectionSpec(method="mis")
    )
    torch.testing.assert_close(out.weights, torch.tensor([[0.0, 0.0, 1.5]]))
    assert out.metrics["rollout_corr/mask_frac"] == pytest.approx(2 / 3)


def test_icepop_masks_per_token_even_when_level_is_sequence():
    # token ratios 3 and 1/3: sequence product 1 (inside), but IcePop masks the token at 3 and 1/3
    old = torch.log(torch.tensor([[3.0, 1 / 3, 1.0]]))
    spec = RolloutCorrectionSpec(method="icepop", level="sequence")
    out = rollout_correction(old, torch.zeros(1, 3), torch.ones(1, 3), spec=spec)
    torch.testing.assert_close(out.weights, torch.tensor([[0.0, 0.0, 1.0]]))
    mis_seq = rollout_correction(
        old,
        torch.zeros(1, 3),
        torch.ones(1, 3),
        spec=RolloutCorrectionSpec(method="mis", level="sequence"),
    )
    torch.testing.assert_close(mis_seq.weights, torch.ones(1, 3))


def test_seq_mask_drops_sequences_by_mult_prob_error():
    # seq 0: |d| = 0.1, 0.1 -> error e^0.1 = 1.105 > 1.05 (dropped); seq 1: (e^0.01 + 1)/2 = 1.005 (kept)
    old = torch.tensor([[0.1, -0.1], [0.01, 0.0]])
    spec = RolloutCorrectionSpec(method="seq_mask", threshold_low=0.5, threshold_high=1.05)
    out = rollout_correction(old, torch.zeros(2, 2), torch.ones(2, 2), spec=spec)
    torch.testing.assert_close(out.weights, torch.tensor([[0.0, 0.0], [1.0, 1.0]]))
    assert out.metrics["rollout_corr/mask_frac"] == pytest.approx(0.5)


def test_mismatch_metrics_by_hand_and_padding_ignored():
    # real tokens d = 0.1, 0; padding has a huge difference that must not count
    train = torch.tensor([[-1.0, -2.0, 0.0]])
    rollout = torch.tensor([[-1.1, -2.0, -50.0]])
    mask = torch.tensor([[1, 1, 0]])
    m = mismatch_metrics(train, rollout, mask)
    assert m["mismatch/token_mult_prob_error"] == pytest.approx((math.exp(0.1) + 1) / 2)
    assert m["mismatch/kl_k3"] == pytest.approx((math.exp(0.1) - 1 - 0.1) / 2)
    assert m["mismatch/abs_dlogp_max"] == pytest.approx(0.1)
    assert m["mismatch/abs_dlogp_mean"] == pytest.approx(0.05)


def test_mismatch_metrics_read_perfect_for_bitwise_equal_logprobs():
    logp = -torch.rand(3, 4)
    m = mismatch_metrics(logp, logp.clone(), torch.ones(3, 4))
    assert m == {
        "mismatch/token_mult_prob_error": 1.0,
        "mismatch/kl_k3": 0.0,
        "mismatch/abs_dlogp_max": 0.0,
        "mismatch/abs_dlogp_mean": 0.0,
    }


def test_mismatch_by_position_averages_real_tokens_and_is_nan_free():
    # |d| rows [0.1, 0, pad, pad] and [0.3, pad, pad, pad] -> [0.2, 0, 0, 0]
    train = torch.tensor([[0.1, 0.0, 7.0, 7.0], [0.3, 7.0, 7.0, 7.0]])
    mask = torch.tensor([[1, 1, 0, 0], [1, 0, 0, 0]])
    curve = mismatch_by_position(train, torch.zeros(2, 4), mask)
    torch.testing.assert_close(curve, torch.tensor([0.2, 0.0, 0.0, 0.0], dtype=torch.float64))
    assert torch.isfinite(curve).all()


def test_overlong_penalty_ramps_inside_buffer():
    # max 10, buffer 4: free up to 6, then -1/4 per token, -1 at 10
    lengths = torch.tensor([3, 6, 7, 8, 10])
    pen = overlong_penalty(lengths, max_tokens=10, overlong_buffer=4, penalty=1.0)
    torch.testing.assert_close(pen, torch.tensor([0.0, 0.0, -0.25, -0.5, -1.0]))
    assert torch.all(overlong_penalty(lengths, max_tokens=10, overlong_buffer=0, penalty=1.0) == 0)


def test_dynamic_sampling_drops_all_correct_all_wrong_and_residue_groups():
    rewards = torch.tensor([1.0, 1.0, 0.0, 0.0, 1.0, 0.0, 0.1 + 0.25, 0.35], dtype=torch.float64)
    keep = dynamic_sampling_keep(rewards, group_size=2, std_floor=1e-3)
    assert keep.tolist() == [False, False, True, False]
