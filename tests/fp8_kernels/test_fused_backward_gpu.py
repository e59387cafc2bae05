"""GPU: the fast RMSNorm / SwiGLU backward kernels (``fused_backward_triton``) at Llama-3.1-8B
shapes in BF16, against float64 autograd: no less accurate than the recomputed torch
composition they replaced (``fused.set_triton_backward(False)``)."""

from __future__ import annotations

import pytest
import torch

from fp8rl.kernels import fused

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]
BF16 = torch.bfloat16


def _rel(a, r) -> float:
    return float((a.double() - r).norm() / r.norm())


def _grads(fn, inputs, grad, triton_backward: bool):
    previous = fused.set_triton_backward(triton_backward)
    try:
        leaves = [t.detach().clone().requires_grad_() for t in inputs]
        return torch.autograd.grad(fn(*leaves), leaves, grad)
    finally:
        fused.set_triton_backward(previous)


@pytest.mark.parametrize("hidden", [4096, 8192])
def test_rms_norm_backward_is_as_accurate_as_the_torch_composition(hidden):
    gen = torch.Generator(device="cuda").manual_seed(0)
    x = (torch.randn(4096, hidden, device="cuda", generator=gen) * 3).to(BF16)
    w = torch.rand(hidden, device="cuda", generator=gen) + 0.5  # an FP32 master gain
    g = torch.randn(4096, hidden, device="cuda", generator=gen).to(BF16)

    def norm(x_, w_):
        return fused.rms_norm_fast(x_, w_, 1e-5)

    new, old = _grads(norm, (x, w), g, True), _grads(norm, (x, w), g, False)
    ref = [t.double().requires_grad_() for t in (x, w)]
    y = ref[1] * (ref[0] * torch.rsqrt(ref[0].pow(2).mean(-1, keepdim=True) + 1e-5))
    truth = torch.autograd.grad(y, ref, g.double())
    assert new[0].dtype == BF16 and new[1].dtype == torch.float32
    for n, o, t in zip(new, old, truth, strict=True):
        assert _rel(n, t) <= 1.5 * _rel(o, t) + 1e-4


def test_swiglu_backward_is_as_accurate_as_the_torch_composition_on_gemm_halves():
    gen = torch.Generator(device="cuda").manual_seed(1)
    gate_up = (torch.randn(2048, 2 * 14336, device="cuda", generator=gen) * 2).to(BF16)
    g = torch.randn(2048, 14336, device="cuda", generator=gen).to(BF16)

    def swiglu(gu):
        return fused.silu_mul_fast(gu[:, :14336], gu[:, 14336:])  # views of one GEMM output

    (new,), (old,) = _grads(swiglu, (gate_up,), g, True), _grads(swiglu, (gate_up,), g, False)
    ref = gate_up.double().requires_grad_()
    (truth,) = torch.autograd.grad(
        torch.nn.functional.silu(ref[:, :14336]) * ref[:, 14336:], ref, g.double()
    )
    assert new.dtype == BF16
    assert _rel(new, truth) <= 1.5 * _rel(old, truth) + 1e-4
