"""Deferred finiteness checks (``kernels.finite.deferred_finite_checks``): no host sync per
quantization inside the block, the same error at its end (issue 14: a sync per quantization)."""

from __future__ import annotations

import pytest
import torch

from fp8rl.kernels import FP8Linear, deferred_finite_checks
from fp8rl.kernels.quant import per_block_quant, per_column_group_quant, per_token_group_quant

CASES = [
    (per_token_group_quant, (3, 300), (2, 260), "a 1x128 row group"),
    (per_block_quant, (300, 300), (200, 10), "a 128x128 block"),
    (per_column_group_quant, (300, 7), (130, 6), "a 128x1 column group"),
]


@pytest.mark.parametrize(("quantize", "shape", "where", "what"), CASES)
@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_a_deferred_check_raises_at_the_block_end_naming_the_quantization(
    quantize, shape, where, what, bad
):
    x = torch.randn(*shape)
    x[where] = bad
    returned = []
    with (
        pytest.raises(ValueError, match=rf"^layer3\.input: non-finite input .* in {what} "),
        deferred_finite_checks(),
    ):
        quantize(x, name="layer3.input")
        returned.append(True)  # the call itself did not raise
    assert returned == [True]


def test_the_first_bad_quantization_of_a_block_is_reported():
    good, bad = torch.randn(4, 256), torch.randn(4, 256)
    bad[1, 0] = float("nan")
    other = bad.clone()
    with (
        pytest.raises(ValueError, match=r"^second: non-finite.*2 of 3 quantizations"),
        deferred_finite_checks(),
    ):
        per_token_group_quant(good, name="first")
        per_token_group_quant(bad, name="second")
        per_token_group_quant(other, name="third")


def test_a_clean_block_raises_nothing_and_checks_are_immediate_again_after_it():
    x = torch.randn(8, 256)
    with deferred_finite_checks():
        per_token_group_quant(x)
    x[0, 0] = float("inf")
    with pytest.raises(ValueError, match="non-finite"):
        per_token_group_quant(x)  # outside any block: at the call


def test_an_error_inside_the_block_propagates_and_drops_the_queued_checks():
    x = torch.randn(2, 128)
    x[0, 0] = float("nan")
    with pytest.raises(RuntimeError, match="boom"), deferred_finite_checks():
        per_token_group_quant(x)
        raise RuntimeError("boom")
    with pytest.raises(ValueError, match="non-finite"):
        per_token_group_quant(x)  # the block is gone: immediate again


def test_nested_blocks_check_their_own_quantizations_at_their_own_end():
    bad = torch.randn(2, 128)
    bad[1, 5] = float("nan")
    seen = []
    with deferred_finite_checks():
        with pytest.raises(ValueError, match="inner: non-finite"), deferred_finite_checks():
            per_token_group_quant(bad, name="inner")
        per_token_group_quant(torch.randn(2, 128), name="outer")
        seen.append("outer block went on")
    assert seen == ["outer block went on"]


def test_a_non_finite_gradient_in_the_backward_is_caught_by_the_block():
    layer = FP8Linear(256, 128)
    x = torch.randn(4, 256, requires_grad=True)
    grad = torch.randn(4, 128)
    grad[2, 3] = float("inf")
    with pytest.raises(ValueError, match="grad_output: non-finite"), deferred_finite_checks():
        layer(x).backward(grad)
