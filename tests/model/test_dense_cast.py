"""A weight cast once for several GEMMs gives the casting linear's outputs and gradients."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from fp8rl.kernels.dense_cast import cast_linear, cast_weight

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
