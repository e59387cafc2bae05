"""DGrad's transposed FP8 weight on the GPU: the tiled transpose is a bitwise copy and the DGrad
product through it is the product through ``contiguous()``."""

from __future__ import annotations

import pytest
import torch

from fp8rl.kernels import QuantizedTensor, fp8_gemm, per_block_quant, per_token_group_quant
from fp8rl.kernels.transpose_triton import transpose_codes

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


@pytest.mark.parametrize("shape", [(14336, 4096), (4096, 14336), (1024, 4096), (200, 136)])
def test_transpose_is_a_bitwise_copy(shape):
    src = torch.randint(0, 256, shape, dtype=torch.uint8, device="cuda")
    out = transpose_codes(src.view(torch.float8_e4m3fn))
    assert torch.equal(out.view(torch.uint8), src.t().contiguous())


@pytest.mark.parametrize("exact", [False, True])
def test_dgrad_through_the_transposed_view_equals_the_copied_operand(exact):
    torch.manual_seed(0)
    wq = per_block_quant(torch.randn(1024, 4096, device="cuda") * 0.02)
    grad = per_token_group_quant(torch.randn(512, 1024, device="cuda", dtype=torch.bfloat16))
    view = wq.t()  # what FP8LinearFunction.backward passes
    copied = QuantizedTensor(
        view.codes.view(torch.uint8).contiguous().view(view.codes.dtype), view.scale, view.block
    )
    got = fp8_gemm(grad, view, out_dtype=torch.bfloat16, exact=exact)
    want = fp8_gemm(grad, copied, out_dtype=torch.bfloat16, exact=exact)
    assert torch.equal(got, want)
