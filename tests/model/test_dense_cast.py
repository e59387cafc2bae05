"""A weight cast once for several GEMMs gives the casting linear's outputs and gradients."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from fp8rl.kernels.dense_cast import GradSum, cast_linear, cast_weight

BF16 = torch.bfloat16


@pytest.mark.parametrize(("shape", "bias"), [((37, 64), False), ((3, 11, 64), True)])
def test_cast_linear_outputs_and_gradients_are_bitwise_the_casting_linear(shape, bias):
    torch.manual_seed(0)
    w = torch.randn(300, 64, requires_grad=True)
    b = torch.randn(300, requires_grad=True) if bias else None
    x = torch.randn(*shape, dtype=BF16, requires_grad=True)
    g = torch.randn(*shape[:-1], 300, dtype=BF16)
    y1 = F.linear(x, w.to(BF16), None if b is None else b.to(BF16))
    y1.backward(g)
    expected = [t.grad.clone() for t in (x, w, b) if t is not None]
    for t in (x, w, b):
        if t is not None:
            t.grad = None
    y2 = cast_linear(x, w, cast_weight(w, BF16), b)
    y2.backward(g)
    assert torch.equal(y1, y2)
    got = [t.grad for t in (x, w, b) if t is not None]
    assert all(torch.equal(e, r) and e.dtype == r.dtype for e, r in zip(expected, got, strict=True))


def test_cast_weight_is_none_when_the_weight_already_has_the_dtype():
    assert cast_weight(torch.zeros(4, 4, dtype=BF16), BF16) is None


def test_cast_linear_refuses_a_cast_of_another_dtype_or_shape():
    w, x = torch.zeros(8, 4), torch.zeros(2, 4, dtype=BF16)
    with pytest.raises(ValueError, match="cast_weight"):
        cast_linear(x, w, torch.zeros(8, 4, dtype=torch.float16))
    with pytest.raises(ValueError, match="cast_weight"):
        cast_linear(x, w, torch.zeros(4, 8, dtype=BF16))


def test_grad_sum_hands_the_weight_the_sum_of_its_calls_once_bitwise_on_cpu():
    torch.manual_seed(0)
    w = torch.randn(300, 64, requires_grad=True)
    x = torch.randn(10, 64, dtype=BF16, requires_grad=True)
    g = torch.randn(10, 300, dtype=BF16)
    cast = cast_weight(w, BF16)
    y = torch.cat([cast_linear(x[i : i + 4], w, cast) for i in (0, 4, 8)])
    y.backward(g)
    expected = w.grad.clone(), x.grad.clone()
    w.grad = x.grad = None
    grad_sum = GradSum(w)
    xs = grad_sum.collect(x)
    y2 = torch.cat([cast_linear(xs[i : i + 4], w, cast, grad_sum=grad_sum) for i in (0, 4, 8)])
    assert grad_sum.total is None and w.grad is None  # nothing before the backward
    y2.backward(g)
    assert torch.equal(y, y2)
    assert torch.equal(w.grad, expected[0]) and torch.equal(x.grad, expected[1])
    assert grad_sum.total is None  # handed over, not kept


def test_grad_sum_refuses_an_input_outside_its_collect_and_another_weight():
    w, other = torch.randn(8, 4, requires_grad=True), torch.randn(8, 4, requires_grad=True)
    x = torch.randn(6, 4, dtype=BF16, requires_grad=True)
    grad_sum = GradSum(w)
    with pytest.raises(ValueError, match="collect"):
        cast_linear(x, w, cast_weight(w, BF16), grad_sum=grad_sum)  # would lose ∇W silently
    xs = grad_sum.collect(x)
    with pytest.raises(ValueError, match="collect"):  # x's own slice shares storage, not history
        cast_linear(x[:2], w, cast_weight(w, BF16), grad_sum=grad_sum)
    with pytest.raises(ValueError, match="collect"):
        cast_linear(xs, other, cast_weight(other, BF16), grad_sum=grad_sum)
    cast_linear(xs[2:4].contiguous(), w, cast_weight(w, BF16), grad_sum=grad_sum)  # a copy is fine
    with pytest.raises(ValueError, match="one GradSum per pass"):
        grad_sum.collect(x)


def test_grad_sum_keeps_nothing_from_a_backward_that_stopped_before_its_collect():
    torch.manual_seed(0)
    w = torch.randn(30, 16, requires_grad=True)
    b = torch.randn(30, requires_grad=True)
    x = torch.randn(8, 16, dtype=BF16, requires_grad=True)
    cast = cast_weight(w, BF16)
    per_chunk = torch.cat([cast_linear(x[i : i + 4], w, cast, b) for i in (0, 4)])
    reference = torch.autograd.grad(per_chunk.float().sum(), w)[0]
    grad_sum = GradSum(w)
    xs = grad_sum.collect(x)
    y = torch.cat([cast_linear(xs[i : i + 4], w, cast, b, grad_sum=grad_sum) for i in (0, 4)])
    torch.autograd.grad(y.float().sum(), b, retain_graph=True)  # chunk backwards run, collect not
    y.float().sum().backward()
    assert torch.equal(w.grad, reference)  # once, not twice
