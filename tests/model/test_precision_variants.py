"""Precision variants of mismatch attribution: each switches on one FP8 ingredient alone."""

from __future__ import annotations

import pytest
import torch

from fp8rl.kernels import per_block_quant
from fp8rl.services.mismatch import ModeReport
from fp8rl.services.mismatch_attribution import shares
from fp8rl.workers.model.precision_variants import (
    activation_round_trip,
    build_variant,
    weights_through_fp8,
)


def test_weights_variant_holds_the_dequantized_block_codes_and_leaves_others():
    gen = torch.Generator().manual_seed(0)
    state = {"a.weight": torch.randn(256, 256, generator=gen), "b.weight": torch.randn(8, 8)}
    out = weights_through_fp8(state, ["a"])
    expected = per_block_quant(state["a.weight"]).dequantize(torch.float32)
    assert torch.equal(out["a.weight"], expected)
    assert not torch.equal(out["a.weight"], state["a.weight"])
    assert out["b.weight"] is state["b.weight"]


def test_activation_round_trip_changes_values_by_at_most_e4m3_rounding():
    x = torch.randn(3, 256, generator=torch.Generator().manual_seed(1))
    y = activation_round_trip(x)
    assert y.shape == x.shape and y.dtype == x.dtype and not torch.equal(x, y)
    # E4M3 keeps 3 mantissa bits: relative error <= 2^-4 for normal values
    big = x.abs() > x.abs().amax(dim=-1, keepdim=True) / 64
    assert ((y - x).abs()[big] <= x.abs()[big] * 2**-4 + 1e-6).all()


def test_shares_are_fractions_of_the_summed_kl():
    def rep(name, kl):
        return ModeReport(name, {"mismatch/kl_k3": kl}, [], 1)

    got = shares([rep("weights", 3e-4), rep("activations", 1e-4), rep("kernels", 0.0)])
    assert got == pytest.approx({"weights": 0.75, "activations": 0.25, "kernels": 0.0})


def test_unknown_variant_is_refused():
    with pytest.raises(ValueError, match="unknown attribution variant"):
        build_variant("bias", None, {}, bf16=None, fp8=None, prompts=[], max_positions=8)
