"""Grouped q/k/v and gate/up FP8 linears on the GPU: the trainer's one GEMM per pass gives the
per-module rows bitwise (cuBLASLt / decode kernel columns do not depend on ΣN)."""

from __future__ import annotations

import pytest
import torch

from fp8rl.kernels import FP8Linear, deferred_finite_checks, grouped_fp8_linear

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


@pytest.mark.parametrize("rows", [64, 4096])
@pytest.mark.parametrize("sizes", [(4096, 1024, 1024), (14336, 14336)], ids=["qkv", "gate_up"])
def test_grouped_rows_are_bitwise_the_per_module_rows_and_gradients_close(rows, sizes):
    torch.manual_seed(0)
    layers = [FP8Linear(4096, n, bias=False, device="cuda", dtype=torch.float32) for n in sizes]
    x = torch.randn(rows, 4096, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    with deferred_finite_checks():
        grouped = grouped_fp8_linear(x, layers)
        alone = [layer(x) for layer in layers]
        assert all(torch.equal(a, b) for a, b in zip(grouped, alone, strict=True))
        grads = [torch.randn_like(y) for y in grouped]
        params = [x] + [layer.weight for layer in layers]
        got = torch.autograd.grad(grouped, params, grads)
        want = torch.autograd.grad(alone, params, grads)
    torch.testing.assert_close(got[0], want[0], rtol=2e-2, atol=2e-2)  # ∇X: one GEMM over ΣN
    for a, b in zip(got[1:], want[1:], strict=True):  # ∇W: the same rows, one WGrad
        torch.testing.assert_close(a, b, rtol=1e-3, atol=1e-5)
