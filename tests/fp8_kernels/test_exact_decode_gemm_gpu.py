"""Exact mode's FP8 GEMM at decode sizes runs the decode kernel (``exact_config``); its rows must
be bitwise the fixed-tile kernel's rows at the trainer's M (the batch-invariance exact mode
promises), for every 8B/7B linear shape of the table and for a shape without a table row."""

from __future__ import annotations

import pytest
import torch

from fp8rl.kernels import per_block_quant, per_token_group_quant
from fp8rl.kernels.gemm import fp8_gemm
from fp8rl.kernels.quant import QuantizedTensor

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


def _shapes() -> list[tuple[int, int]]:
    from fp8rl.kernels.gemm_decode_triton import _exact_table

    return [*sorted({(n, k) for _, n, k in _exact_table()}), (384, 256)]


@pytest.mark.parametrize(("n", "k"), _shapes())
def test_exact_decode_rows_are_bitwise_the_fixed_tile_rows_at_m4096(n, k):
    from fp8rl.kernels import gemm_decode_triton, gemm_triton

    gen = torch.Generator(device="cuda").manual_seed(n + k)
    w = per_block_quant(torch.randn(n, k, device="cuda", generator=gen).bfloat16() * 0.02)
    x = per_token_group_quant(torch.randn(4096, k, device="cuda", generator=gen).bfloat16())
    big = gemm_triton.fp8_gemm_triton(x, w, out_dtype=torch.bfloat16, exact=True)
    assert torch.equal(fp8_gemm(x, w, out_dtype=torch.bfloat16, exact=True), big)
    for m in (1, 5, 16, 64, 100, 256):
        assert gemm_decode_triton.exact_config(m, n, k) is not None
        small = QuantizedTensor(x.codes[:m], x.scale[:m], x.block)
        got = fp8_gemm(small, w, out_dtype=torch.bfloat16, exact=True)
        assert torch.equal(got, big[:m]), (m, int((got != big[:m]).sum()))
