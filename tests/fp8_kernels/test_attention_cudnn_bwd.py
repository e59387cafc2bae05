"""When the trainer's attention backward may run cuDNN's (``attention_cudnn_bwd``): the row check
runs anywhere; the GPU numbers are in ``test_exact_triton_gpu.py``."""

from __future__ import annotations

import math
import warnings

import pytest
import torch

from fp8rl.kernels import attention_cudnn_bwd as fb
from fp8rl.kernels.invariant import visible_keys

CAUSAL = torch.ones(1, 8, dtype=torch.bool)


def _padded(lengths, n=6, h=2, d=8):
    pos = torch.arange(n).expand(len(lengths), n)
    nvis = visible_keys(pos, torch.tensor(lengths))
    grad = torch.randn(len(lengths), h, n, d)
    pad = (pos >= torch.tensor(lengths)[:, None])[:, None, :, None]
    return nvis, grad, pad


def test_causal_rows_allow_the_cudnn_backward():
    nvis, grad, _ = _padded([6, 6])
    assert fb.causal_or_silent(fb.causal_rows(nvis), grad)


def test_padding_rows_without_a_gradient_allow_it():
    nvis, grad, pad = _padded([6, 4])
    assert fb.causal_or_silent(fb.causal_rows(nvis), grad.masked_fill(pad, 0.0))


def test_a_padding_row_with_a_gradient_keeps_the_triton_backward():
    nvis, grad, pad = _padded([6, 4])
    silent = grad.masked_fill(pad, 0.0)
    silent[1, 1, 5, 3] = 1e-30  # one element of one padding row
    assert not fb.causal_or_silent(fb.causal_rows(nvis), silent)
    assert not fb.causal_or_silent(fb.causal_rows(nvis), grad)


def test_cpu_tensors_never_take_it():
    q = torch.zeros(1, 2, 4, 8, dtype=torch.bfloat16)
    assert not fb.applies(q, q)


def test_causal_rows_are_the_prefix_counts_of_position_plus_one():
    nvis = visible_keys(torch.arange(5).expand(2, 5), torch.tensor([5, 3]))
    expected = torch.tensor([[True] * 5, [True, True, True, False, False]])
    assert torch.equal(fb.causal_rows(nvis), expected)
    assert torch.equal(fb.causal_rows(nvis.long()), expected)


def test_silent_rows_get_a_statistic_that_zeroes_their_probabilities(monkeypatch):
    seen = {}

    def fake(do, q, k, v, out, lse, scale):
        seen["lse"] = lse
        return q, k, v

    monkeypatch.setattr(fb, "_cudnn", fake)
    q = torch.zeros(1, 2, 3, 8)
    lse2 = torch.tensor([[[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]]])
    causal = torch.tensor([[True, True, False]])
    fb.backward(q, q, q, q, lse2, q, 0.25, causal)
    lse = seen["lse"]
    assert lse.shape == (1, 2, 3, 1)
    torch.testing.assert_close(lse[..., :2, 0], lse2[..., :2] * math.log(2.0))
    assert (lse[..., 2, 0] == fb.SILENT_LSE).all()
    assert torch.exp(torch.tensor(80.0) - lse[0, 0, 2, 0]) == 0  # a large score still gives 0


def test_set_enabled_returns_the_previous_setting():
    previous = fb.set_enabled(False)
    try:
        assert fb.set_enabled(True) is False
        assert fb.set_enabled(False) is True
    finally:
        fb.set_enabled(previous)


def test_a_refused_call_returns_none_for_the_triton_kernels_and_warns_once(monkeypatch):
    def refuse(*args, **kwargs):
        raise RuntimeError("no SDPA graph")

    monkeypatch.setattr(fb, "_cudnn", refuse)
    monkeypatch.setattr(fb, "_WARNED", [False])
    monkeypatch.setattr(fb, "_NATIVE_GQA", [True])
    q = torch.zeros(1, 4, 8, 16)
    k = torch.zeros(1, 2, 8, 16)
    lse = torch.zeros(1, 4, 8)
    with pytest.warns(UserWarning, match="no SDPA graph"):
        assert fb.backward(q, k, k, q, lse, q, 0.25, CAUSAL) is None
    assert fb._NATIVE_GQA == [False]  # the repeated-K/V form was tried too
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert fb.backward(q, k, k, q, lse, q, 0.25, CAUSAL) is None


def test_without_native_gqa_the_kv_gradients_are_summed_over_each_group(monkeypatch):
    seen = []

    def fake(do, q, k, v, out, lse, scale):
        seen.append(k.shape[1])
        if k.shape[1] != q.shape[1]:
            raise RuntimeError("GQA not supported")
        return q * 2, k + 1.0, v + 2.0  # per query head: 1 and 2

    monkeypatch.setattr(fb, "_cudnn", fake)
    monkeypatch.setattr(fb, "_NATIVE_GQA", [True])
    q, k = torch.ones(1, 4, 8, 16), torch.zeros(1, 2, 8, 16)
    with pytest.warns(UserWarning, match="repeating K/V per head"):
        dq, dk, dv = fb.backward(q, k, k, q, torch.zeros(1, 4, 8), q, 0.25, CAUSAL)
    assert seen == [2, 4]
    assert torch.equal(dq, q * 2)
    assert dk.shape == k.shape and torch.equal(dk, torch.full_like(k, 2.0))  # 2 heads × 1
    assert torch.equal(dv, torch.full_like(k, 4.0))


def test_out_of_memory_is_raised_not_taken_for_a_refusal(monkeypatch):
    def oom(*args, **kwargs):
        raise torch.OutOfMemoryError("CUDA out of memory")

    monkeypatch.setattr(fb, "_cudnn", oom)
    monkeypatch.setattr(fb, "_NATIVE_GQA", [True])
    q, k = torch.zeros(1, 4, 8, 16), torch.zeros(1, 2, 8, 16)
    with pytest.raises(torch.OutOfMemoryError):
        fb.backward(q, k, k, q, torch.zeros(1, 4, 8), q, 0.25, CAUSAL)
    assert fb._NATIVE_GQA == [True]
