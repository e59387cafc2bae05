"""CPU side of the exact-mode kernels switch: the float64 paths stay in place on CPU (the CPU
engine and trainer stay bitwise with each other), with the new optional arguments accepted."""

from __future__ import annotations

import torch

from fp8rl.kernels.invariant import (
    attention,
    attention_mask,
    float64_inside,
    rms_norm,
    silu_mul,
    triton_exact,
)


def test_cpu_exact_attention_accepts_prefix_arguments_and_ignores_them():
    torch.manual_seed(0)
    q, k, v = torch.randn(2, 4, 9, 8), torch.randn(2, 2, 9, 8), torch.randn(2, 2, 9, 8)
    pos, k_len = torch.arange(9).expand(2, 9), torch.tensor([9, 5])
    mask = attention_mask(pos, k_len, 9)
    plain = attention(q, k, v, mask, scale=8**-0.5, exact=True)
    kw = attention(q, k, v, mask, scale=8**-0.5, exact=True, q_pos=pos, k_len=k_len)
    assert torch.equal(plain, kw)


def test_cpu_exact_ops_still_run_in_float64_and_are_recomputed():
    x = torch.randn(3, 8, dtype=torch.bfloat16)
    assert not triton_exact(x)
    assert all(float64_inside(fn, x) for fn in (attention, rms_norm, silu_mul))
    w = torch.ones(8)
    ref = (x.double() * torch.rsqrt(x.double().pow(2).mean(-1, keepdim=True) + 1e-6)).to(x.dtype)
    assert torch.equal(rms_norm(x, w, 1e-6, exact=True), ref)
