"""CPU tests of the blockwise FP8 GEMM (exact float64 emulation) and the backend dispatcher."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fp8rl.kernels import (
    FP8_DTYPE,
    QuantizedTensor,
    fp8_gemm,
    kernel_backend,
    per_block_quant,
    per_column_group_quant,
    per_token_group_quant,
    scaled_mm_scales,
)

PROPERTY = settings(max_examples=25, deadline=None, derandomize=True)
QUANTIZERS = {"row": per_token_group_quant, "block": per_block_quant}


def _float64_product(a: QuantizedTensor, b: QuantizedTensor) -> torch.Tensor:
    """Brute force: dequantize both operands exactly in float64 and multiply."""
    return a.dequantize(torch.float64) @ b.dequantize(torch.float64).t()


def _fp8_error_bound(x, a, w, b) -> torch.Tensor:
    """|x·wᵀ - x̂·ŵᵀ| bound from E4M3 rounding: 2**-4 relative, 2**-10·scale in the subnormals."""
    ex = torch.maximum(x.double().abs() * 2**-4, a.expanded_scale().double() * 2**-10)
    ew = torch.maximum(w.double().abs() * 2**-4, b.expanded_scale().double() * 2**-10)
    xa, wa = x.double().abs(), w.double().abs()
    return (ex @ wa.t() + xa @ ew.t() + ex @ ew.t()) * (1 + 1e-9) + 1e-300


def _rel(x: torch.Tensor, ref: torch.Tensor) -> float:
    return float((x.double() - ref).norm() / ref.norm())


@PROPERTY
@given(
    m=st.integers(1, 300),
    n=st.integers(1, 300),
    k=st.integers(1, 400),
    kinds=st.sampled_from([("row", "block"), ("row", "row"), ("block", "row")]),
    seed=st.integers(0, 2**16),
)
def test_fp8_gemm_matches_float64_product_of_dequantized_operands(m, n, k, kinds, seed):
    gen = torch.Generator().manual_seed(seed)
    x, w = torch.randn(m, k, generator=gen), torch.randn(n, k, generator=gen) * 0.1
    a, b = QUANTIZERS[kinds[0]](x), QUANTIZERS[kinds[1]](w)
    out = fp8_gemm(a, b, out_dtype=torch.float64)
    ref = _float64_product(a, b)
    assert out.shape == (m, n)
    # per-block products are exact; only the scale multiply and the K-block sums round (float64)
    assert torch.allclose(out, ref, rtol=1e-13, atol=1e-13 * float(ref.abs().max()))
    # and approximates the unquantized product within the E4M3 rounding bound, elementwise
    assert bool(((out - x.double() @ w.double().t()).abs() <= _fp8_error_bound(x, a, w, b)).all())


def test_fp8_gemm_output_dtype_is_rounded_once_from_float64():
    a, b = per_token_group_quant(torch.randn(9, 300)), per_block_quant(torch.randn(40, 300))
    full = fp8_gemm(a, b, out_dtype=torch.float64)
    assert torch.equal(fp8_gemm(a, b, out_dtype=torch.float32), full.float())
    assert torch.equal(fp8_gemm(a, b, out_dtype=torch.bfloat16), full.to(torch.bfloat16))


def test_gemm_rows_are_bitwise_independent_of_batch_size_and_position():
    gen = torch.Generator().manual_seed(7)
    w = per_block_quant(torch.randn(320, 700, generator=gen))
    row = torch.randn(1, 700, generator=gen) * 3
    results = []
    for m, position in ((1, 0), (64, 17), (257, 256), (257, 3)):
        x = torch.randn(m, 700, generator=gen)
        x[position] = row[0]
        y = fp8_gemm(per_token_group_quant(x), w, out_dtype=torch.float32)
        results.append(y[position])
    for other in results[1:]:
        assert torch.equal(results[0].view(torch.int32), other.view(torch.int32))


def test_k192_equals_zero_padded_k256_and_padding_never_changes_real_outputs():
    x, w = torch.randn(33, 192), torch.randn(320, 192)
    out = fp8_gemm(per_token_group_quant(x), per_block_quant(w), out_dtype=torch.float64)
    xp, wp = torch.nn.functional.pad(x, (0, 64)), torch.nn.functional.pad(w, (0, 64, 0, 64))
    padded = fp8_gemm(per_token_group_quant(xp), per_block_quant(wp), out_dtype=torch.float64)
    assert torch.equal(padded[:, :320], out)


def test_padded_storage_rows_beyond_m_are_never_read():
    m, k = 5, 300
    x = per_token_group_quant(torch.randn(m, k))
    storage = torch.full((64, k), 0x7F, dtype=torch.uint8).view(FP8_DTYPE)  # 0x7F = NaN in E4M3
    storage[:m] = x.codes
    scales = torch.full((64, 3), float("nan"))
    scales[:m] = x.scale
    view = QuantizedTensor(storage[:m], scales[:m], (1, 128))
    w = per_block_quant(torch.randn(40, k))
    out = fp8_gemm(view, w, out_dtype=torch.float32)
    assert bool(torch.isfinite(out).all())
    assert torch.equal(out, fp8_gemm(x, w, out_dtype=torch.float32))


def test_wgrad_operands_contract_over_tokens():
    tokens, n, k = 300, 40, 70  # tokens not a multiple of 128: partial last token group
    dy, x = torch.randn(tokens, n), torch.randn(tokens, k)
    a, b = per_column_group_quant(dy).t(), per_column_group_quant(x).t()
    out = fp8_gemm(a, b, out_dtype=torch.float64)
    assert out.shape == (n, k)
    assert _rel(out, dy.double().t() @ x.double()) < 0.08
    assert torch.allclose(out, _float64_product(a, b), rtol=1e-13, atol=1e-10)


def test_leading_dims_of_a_are_kept():
    x, w = torch.randn(2, 3, 130), per_block_quant(torch.randn(7, 130))
    out = fp8_gemm(per_token_group_quant(x), w, out_dtype=torch.float32)
    flat = fp8_gemm(per_token_group_quant(x.reshape(6, 130)), w, out_dtype=torch.float32)
    assert out.shape == (2, 3, 7) and torch.equal(out.reshape(6, 7), flat)


def test_gemm_rejects_groups_that_do_not_run_along_the_contraction_dim():
    cols = per_column_group_quant(torch.randn(128, 64))
    w = per_block_quant(torch.randn(16, 64))
    with pytest.raises(ValueError, match=r"use \.t\(\)"):
        fp8_gemm(cols, w, out_dtype=torch.float32)
    with pytest.raises(ValueError, match="contraction dims differ"):
        fp8_gemm(per_token_group_quant(torch.randn(4, 65)), w, out_dtype=torch.float32)


def test_scaled_mm_scales_are_outer_dim_major_with_initialised_padding():
    x = per_token_group_quant(torch.randn(10, 384))
    sa = scaled_mm_scales(x)
    assert sa.shape == (10, 3) and sa.stride() == (1, 10) and torch.equal(sa, x.scale)
    w = per_block_quant(torch.randn(320, 640))  # 5 K blocks → padded to 8
    sb = scaled_mm_scales(w)
    assert sb.shape == (8, 3) and sb.stride() == (1, 8)
    assert torch.equal(sb[:5], w.scale.t()) and bool((sb[5:] == 1.0).all())


def test_scaled_mm_scales_of_a_whole_4_block_weight_are_a_view_not_a_copy():
    w = per_block_quant(torch.randn(256, 512))  # 4 K blocks: no padding
    sb = scaled_mm_scales(w)
    assert sb.shape == (4, 2) and sb.stride() == (1, 4)
    assert sb.data_ptr() == w.scale.data_ptr() and torch.equal(sb, w.scale.t())
    w.scale.mul_(2.0)  # an in-place weight update is seen (a CUDA graph replays the new scales)
    assert torch.equal(scaled_mm_scales(w), w.scale.t())
    dgrad = scaled_mm_scales(w.t().t())  # same layout through views: still no copy
    assert dgrad.data_ptr() == w.scale.data_ptr()
    strided = QuantizedTensor(w.codes, w.scale.t().contiguous().t(), w.block)  # column-major
    copied = scaled_mm_scales(strided)
    assert copied.stride() == (1, 4) and torch.equal(copied, w.scale.t())
    assert copied.data_ptr() != w.scale.data_ptr()
    flat = torch.zeros(1 + w.scale.numel())
    offset = QuantizedTensor(w.codes, flat[1:].view(2, 4).copy_(w.scale), w.block)  # 4-byte aligned
    assert torch.equal(scaled_mm_scales(offset), w.scale.t())
    assert scaled_mm_scales(offset).data_ptr() != offset.scale.data_ptr()


def test_scaled_mm_scales_of_a_single_row_still_have_stride_one_then_m():
    # bug fixed: t().contiguous().t() kept stride (K/128, 1) for M = 1; scaled_mm refused it
    sa = scaled_mm_scales(per_token_group_quant(torch.randn(1, 4096)))
    assert sa.shape == (1, 32) and sa.stride() == (1, 1)


def test_kernel_backend_is_cpu_emulation_on_cpu_whatever_exact_says():
    assert kernel_backend("cpu") == "cpu-emulation"
    assert kernel_backend(torch.device("cpu"), exact=True) == "cpu-emulation"
    with pytest.raises(ValueError, match="cpu or cuda"):
        kernel_backend("meta")
