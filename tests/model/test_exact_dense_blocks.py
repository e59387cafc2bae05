"""The exact dense GEMM of a vocabulary-sized weight runs in blocks of rows
(``kernels/dense_exact.py``): the same values and gradients as the one float64 GEMM it replaces,
without a float64 copy of the whole weight (the quickstart trainer's backward peak, issue 18)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from fp8rl.kernels import dense_exact, invariant


def _one_gemm(x, weight, bias):
    """``dense_linear(exact=True)`` before the blocks: one float64 GEMM, rounded once."""
    w = weight.to(x.dtype)
    b = None if bias is None else bias.to(x.dtype)
    return F.linear(x.double(), w.double(), None if b is None else b.double()).to(x.dtype)


@pytest.mark.parametrize("with_bias", [False, True])
def test_blocked_exact_dense_equals_the_single_float64_gemm_values_and_gradients(
    monkeypatch, with_bias
):
    monkeypatch.setattr(dense_exact, "ROWS", 96)  # 1000 rows: 10 full blocks and a partial one
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(3, 7, 64, generator=gen).to(torch.bfloat16)
    weight = torch.randn(1000, 64, generator=gen) * 0.05
    bias = torch.randn(1000, generator=gen) if with_bias else None
    g = torch.randn(3, 7, 1000, generator=gen).to(torch.bfloat16)

    results = []
    for fn in (_one_gemm, dense_exact.exact_dense_linear):
        xs, ws = x.clone().requires_grad_(), weight.clone().requires_grad_()
        bs = None if bias is None else bias.clone().requires_grad_()
        y = fn(xs, ws, bs)
        y.backward(g)
        results.append((y, xs.grad, ws.grad, None if bs is None else bs.grad))
    (y0, gx0, gw0, gb0), (y1, gx1, gw1, gb1) = results
    assert y1.dtype == torch.bfloat16 and torch.equal(y0, y1)
    assert gx1.dtype == torch.bfloat16 and torch.equal(gx0, gx1)
    assert gw1.dtype == torch.float32 and torch.equal(gw0, gw1)
    if with_bias:
        assert torch.equal(gb0, gb1)


def test_dense_linear_takes_the_blocked_path_for_vocabulary_sized_weights_only(monkeypatch):
    calls = []
    monkeypatch.setattr(invariant, "exact_dense_linear", lambda *a, **k: calls.append(a) or a[0])
    monkeypatch.setattr(invariant, "MIN_ELEMENTS", 1000)
    x = torch.randn(2, 8).to(torch.bfloat16)
    invariant.dense_linear(x, torch.randn(125, 8), exact=True)  # 1000 elements: blocked
    invariant.dense_linear(x, torch.randn(124, 8), exact=True)  # smaller: one GEMM
    invariant.dense_linear(x, torch.randn(125, 8), exact=False)  # fast path: unchanged
    assert len(calls) == 1
