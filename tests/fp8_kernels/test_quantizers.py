"""CPU tests of the FP8 quantizers (torch references = the public path on CPU)."""

from __future__ import annotations

import math
import re

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fp8rl.kernels import (
    FP8_DTYPE,
    FP8_E4M3_MAX,
    MIN_SCALE,
    QuantizedTensor,
    per_block_quant,
    per_column_group_quant,
    per_token_and_column_group_quant,
    per_token_group_quant,
    requant_to_column_groups,
    round_up_pow2,
)
from fp8rl.kernels.quant import _to_codes

PROPERTY = settings(max_examples=25, deadline=None, derandomize=True)


def _float64_row_quant(x: torch.Tensor, scale_format: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Independent float64 statement of the 1x128 rule: returns (codes as float64, scale)."""
    x64 = x.to(torch.float64)
    k = x64.shape[-1]
    groups = math.ceil(k / 128)
    padded = torch.nn.functional.pad(x64, (0, groups * 128 - k)).reshape(*x.shape[:-1], groups, 128)
    amax = padded.abs().amax(-1)
    # float64 quotient rounded once to float32 == IEEE float32 division (53 >= 2*24+2 bits)
    scale = torch.clamp((amax / 448.0).to(torch.float32), min=MIN_SCALE)
    if scale_format == "pow2":
        mantissa, exponent = torch.frexp(scale)
        scale = torch.ldexp(torch.ones_like(scale), exponent - (mantissa == 0.5).to(exponent.dtype))
    q = (padded / scale.to(torch.float64).unsqueeze(-1)).clamp(-448, 448)
    codes = q.to(torch.float32).to(FP8_DTYPE).to(torch.float64).reshape(*x.shape[:-1], -1)[..., :k]
    return codes, scale


@PROPERTY
@given(
    rows=st.integers(1, 70),
    k=st.integers(1, 400),
    scale_format=st.sampled_from(["fp32", "pow2"]),
    dtype=st.sampled_from([torch.float32, torch.bfloat16]),
    seed=st.integers(0, 2**16),
)
def test_per_token_group_quant_matches_float64_statement_of_the_rule(
    rows, k, scale_format, dtype, seed
):
    gen = torch.Generator().manual_seed(seed)
    x = (torch.randn(rows, k, generator=gen) * torch.rand(rows, 1, generator=gen) * 50).to(dtype)
    q = per_token_group_quant(x, scale_format=scale_format)
    codes, scale = _float64_row_quant(x, scale_format)
    assert q.codes.dtype == FP8_DTYPE and q.scale.dtype == torch.float32
    assert q.scale.shape == (rows, math.ceil(k / 128))
    assert torch.equal(q.scale, scale)
    assert torch.equal(q.codes.to(torch.float64), codes)


@PROPERTY
@given(n=st.integers(1, 300), k=st.integers(1, 300), scale_format=st.sampled_from(["fp32", "pow2"]))
def test_per_block_quant_equals_row_quant_of_each_block(n, k, scale_format):
    w = torch.randn(n, k, generator=torch.Generator().manual_seed(n * 1000 + k)) * 3
    q = per_block_quant(w, scale_format=scale_format)
    assert q.scale.shape == (math.ceil(n / 128), math.ceil(k / 128))
    # each 128x128 block flattened is one group: its amax, scale and codes must agree
    for bn in range(q.scale.shape[0]):
        for bk in range(q.scale.shape[1]):
            block = w[bn * 128 : (bn + 1) * 128, bk * 128 : (bk + 1) * 128]
            amax = block.abs().max()
            expected = torch.clamp(amax / FP8_E4M3_MAX, min=MIN_SCALE)
            if scale_format == "pow2":
                expected = round_up_pow2(expected.reshape(1))[0]
            assert q.scale[bn, bk] == expected
            codes = q.codes[bn * 128 : (bn + 1) * 128, bk * 128 : (bk + 1) * 128]
            assert torch.equal(codes, _to_codes(block / expected))


def test_dequantized_error_within_half_e4m3_ulp():
    x = torch.randn(64, 1000) * 7
    q = per_token_group_quant(x)
    err = (q.dequantize(torch.float64) - x.double()).abs()
    scale = q.expanded_scale().double()
    # normal E4M3 range: relative 2**-4; subnormal range (|x/scale| < 2**-6): absolute 2**-10 * scale
    bound = torch.maximum(x.double().abs() * 2**-4, scale * 2**-10)
    assert bool((err <= bound * (1 + 1e-12)).all())


def test_pow2_scale_is_the_smallest_power_of_two_not_below_amax_over_448():
    x = torch.randn(300, 256) * torch.logspace(-30, 30, 300).unsqueeze(1)
    fp32 = per_token_group_quant(x, scale_format="fp32").scale.double()
    pow2 = per_token_group_quant(x, scale_format="pow2").scale.double()
    mantissa, _ = torch.frexp(pow2)
    assert bool((mantissa == 0.5).all()), "every pow2 scale is a power of two"
    assert bool((pow2 >= fp32).all()) and bool((pow2 < 2 * fp32).all())


def test_round_up_pow2_keeps_powers_of_two_and_rounds_others_up():
    s = torch.tensor(
        [1.0, 0.75, 1.5, 2.0**-126, 3.0 * 2**-126, 2.0**100 * 1.0001], dtype=torch.float32
    )
    expected = torch.tensor([1.0, 1.0, 2.0, 2.0**-126, 2.0**-124, 2.0**101], dtype=torch.float32)
    assert torch.equal(round_up_pow2(s), expected)


@pytest.mark.parametrize("scale_format", ["fp32", "pow2"])
def test_all_zero_group_gives_zero_codes_and_finite_scale(scale_format):
    x = torch.randn(4, 384)
    x[1, 128:256] = 0.0
    x[3] = 0.0
    for q, zero_scales in (
        (per_token_group_quant(x, scale_format=scale_format), [(1, 1), (3, 0), (3, 2)]),
        (per_block_quant(torch.zeros(130, 200), scale_format=scale_format), [(0, 0), (1, 1)]),
        (per_column_group_quant(torch.zeros(3, 5), scale_format=scale_format), [(0, 4)]),
    ):
        assert bool(torch.isfinite(q.scale).all()) and bool((q.scale > 0).all())
        for idx in zero_scales:
            assert q.scale[idx] == MIN_SCALE
        assert not bool(torch.isnan(q.codes.float()).any())
    assert bool((per_token_group_quant(x).codes[3].float() == 0).all())
    requant = requant_to_column_groups(per_token_group_quant(torch.zeros(2, 130)))
    assert bool((requant.codes.float() == 0).all()) and bool((requant.scale == MIN_SCALE).all())


def test_values_beyond_448_become_448_codes_not_nan():
    # some casts (Triton's CPU interpreter, older torch) turn 465 into NaN; the clamp comes first
    beyond = torch.tensor([465.0, -465.0, 1e30, 448.5, float(torch.finfo(torch.float32).max)])
    assert _to_codes(beyond).float().tolist() == [448.0, -448.0, 448.0, 448.0, 448.0]


def test_extreme_magnitudes_never_produce_nan_codes_and_hit_448():
    x = torch.randn(256, 512) * torch.logspace(-38, 37, 256).unsqueeze(1)
    x[0, :4] = torch.tensor([3.4e38, -3.4e38, 1e-45, 0.0])
    for scale_format in ("fp32", "pow2"):
        q = per_token_group_quant(x, scale_format=scale_format)
        codes = q.codes.float()
        assert not bool(torch.isnan(codes).any())
        assert float(codes.abs().max()) <= FP8_E4M3_MAX
        if scale_format == "fp32":  # every group above the scale floor uses the full range
            above_floor = x.reshape(256, 4, 128).abs().amax(-1) >= FP8_E4M3_MAX * MIN_SCALE
            full_range = codes.reshape(256, 4, 128).abs().amax(-1) == FP8_E4M3_MAX
            assert bool(full_range[above_floor].all()) and bool(above_floor.any())


def test_k192_n320_gives_ceil_grids_and_padding_never_changes_real_outputs():
    w = torch.randn(320, 192)
    q = per_block_quant(w)
    assert q.scale.shape == (3, 2)
    padded = per_block_quant(torch.nn.functional.pad(w, (0, 64, 0, 64)))
    assert torch.equal(padded.codes[:320, :192], q.codes) and torch.equal(padded.scale, q.scale)
    x = torch.randn(5, 192)
    rows = per_token_group_quant(x)
    padded_rows = per_token_group_quant(torch.nn.functional.pad(x, (0, 64)))
    assert rows.scale.shape == (5, 2)
    assert torch.equal(padded_rows.codes[:, :192], rows.codes)
    assert torch.equal(padded_rows.scale, rows.scale)
    cols = per_column_group_quant(torch.randn(192, 320))
    assert cols.scale.shape == (2, 320)


@pytest.mark.parametrize(
    ("quantize", "shape", "where", "index"),
    [
        (per_token_group_quant, (3, 300), (2, 260), "(2, 2)"),
        (per_block_quant, (300, 300), (200, 10), "(1, 0)"),
        (per_column_group_quant, (300, 7), (130, 6), "(1, 6)"),
    ],
)
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_nan_or_inf_input_raises_value_error_naming_the_group(quantize, shape, where, index, bad):
    x = torch.randn(*shape)
    x[where] = bad
    with pytest.raises(ValueError, match=rf"non-finite.*scale index {re.escape(index)}"):
        quantize(x, name="layer3.input")
    with pytest.raises(ValueError, match=r"layer3\.input"):
        quantize(x, name="layer3.input")


def test_quantizer_rows_are_bitwise_independent_of_batch_size():
    big = torch.randn(4096, 320, dtype=torch.bfloat16)
    row = big[1234:1235].clone()
    q_big, q_one = per_token_group_quant(big), per_token_group_quant(row)
    assert torch.equal(q_big.codes[1234:1235].view(torch.uint8), q_one.codes.view(torch.uint8))
    assert torch.equal(q_big.scale[1234:1235], q_one.scale)


def test_leading_dims_quantize_like_the_flattened_rows():
    x = torch.randn(2, 3, 200)
    q, flat = per_token_group_quant(x), per_token_group_quant(x.reshape(6, 200))
    assert q.codes.shape == (2, 3, 200) and q.scale.shape == (2, 3, 2)
    assert torch.equal(q.codes.reshape(6, 200), flat.codes)
    assert torch.equal(q.scale.reshape(6, 2), flat.scale)


def test_column_group_quant_is_row_quant_of_the_transpose():
    x = torch.randn(300, 70)
    cols, rows = per_column_group_quant(x), per_token_group_quant(x.t().contiguous())
    assert cols.block == (128, 1) and cols.scale.shape == (3, 70)
    assert torch.equal(cols.t().codes, rows.codes) and torch.equal(cols.t().scale, rows.scale)
    assert cols.t().codes.is_contiguous(), "WGrad reads the token-contiguous storage"


@pytest.mark.parametrize("scale_format", ["fp32", "pow2"])
def test_requant_to_column_groups_quantizes_the_exactly_dequantized_fp8_activation(scale_format):
    x = torch.randn(2, 150, 200, dtype=torch.bfloat16)
    saved = per_token_group_quant(x, scale_format=scale_format)
    requant = requant_to_column_groups(saved, scale_format=scale_format)
    # codes * scale rounded once to float32 == the float32 product the requantizer uses
    dequant = (saved.codes.double() * saved.expanded_scale().double()).float().reshape(300, 200)
    expected = per_column_group_quant(dequant, scale_format=scale_format)
    assert requant.block == (128, 1) and requant.scale.shape == (3, 200)
    assert torch.equal(requant.codes, expected.codes) and torch.equal(requant.scale, expected.scale)


def test_requant_rejects_a_tensor_that_is_not_row_grouped():
    with pytest.raises(ValueError, match=r"\(1, 128\) row-group"):
        requant_to_column_groups(per_block_quant(torch.randn(10, 10)))


def test_quantized_tensor_rejects_a_scale_grid_that_does_not_match():
    codes = torch.zeros(320, 192).to(FP8_DTYPE)
    with pytest.raises(ValueError, match=r"expected \(3, 2\)"):
        QuantizedTensor(codes, torch.ones(2, 2), (128, 128))
    with pytest.raises(ValueError, match="float32"):
        QuantizedTensor(codes, torch.ones(3, 2, dtype=torch.bfloat16), (128, 128))
    with pytest.raises(ValueError, match="block must be one of"):
        QuantizedTensor(codes, torch.ones(3, 2), (64, 64))


def test_dequantize_in_float64_is_exact_and_float32_rounds_once():
    q = per_token_group_quant(torch.randn(7, 300))
    exact = q.codes.double() * q.expanded_scale().double()
    assert torch.equal(q.dequantize(torch.float64), exact)
    assert torch.equal(q.dequantize(torch.float32), exact.float())


def test_unknown_scale_format_and_integer_input_are_rejected():
    with pytest.raises(ValueError, match="scale_format"):
        per_token_group_quant(torch.randn(2, 2), scale_format="e8m0")
    with pytest.raises(ValueError, match="int64"):
        per_token_group_quant(torch.ones(2, 2, dtype=torch.int64))


def test_dual_quantization_of_a_gradient_equals_the_two_quantizers():
    g = torch.randn(300, 200, dtype=torch.bfloat16)
    rows, cols = per_token_and_column_group_quant(g, scale_format="pow2")
    expected_rows = per_token_group_quant(g, scale_format="pow2")
    expected_cols = per_column_group_quant(g, scale_format="pow2")
    assert torch.equal(rows.codes, expected_rows.codes) and torch.equal(
        rows.scale, expected_rows.scale
    )
    assert torch.equal(cols.codes, expected_cols.codes) and torch.equal(
        cols.scale, expected_cols.scale
    )
    g[7, 9] = float("inf")
    with pytest.raises(ValueError, match=r"grad: non-finite.*scale index \(7, 0\)"):
        per_token_and_column_group_quant(g, name="grad")
