"""Exact-mode training recomputes the float64 intermediates of RMSNorm, SwiGLU and attention in
the backward pass (``workers/model/recompute.py``) instead of saving them: same gradients, bit
for bit, and a fraction of the saved activations (the quickstart trainer's memory, issue 18)."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from fp8rl.protocol import QuantConfig
from fp8rl.workers.model import decoder as decoder_module
from fp8rl.workers.model.build import build_decoder
from fp8rl.workers.model.config import PRESETS
from fp8rl.workers.model.linear import LayerPrecision

CONFIG = replace(PRESETS["tiny-qwen3"], vocab_size=512, num_hidden_layers=2)


def _loss_and_saved(*, recompute: bool, monkeypatch) -> tuple[dict, int]:
    """Gradients of one exact FP8 trainer step and the float64 bytes autograd saved for it."""
    if not recompute:
        monkeypatch.setattr(decoder_module, "recomputed", lambda fn, *a, **kw: fn(*a, **kw))
    precision = LayerPrecision(
        dtype=torch.bfloat16, fp8=True, quant=QuantConfig(), exact=True, trainable=True
    )
    model = build_decoder(
        CONFIG, precision, state_dict=None, max_positions=64, param_dtype=torch.float32, seed=1
    )
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, CONFIG.vocab_size, (3, 12), generator=gen)
    positions = torch.arange(12).expand(3, 12)
    saved = []

    def pack(t):
        if t.dtype == torch.float64:
            saved.append(t.numel() * t.element_size())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        logp, _ = model.score_responses(
            ids,
            positions,
            torch.tensor([12, 10, 7]),
            torch.tensor([5, 4, 3]),
            ids[:, 5:9],
            temperature=1.0,
            with_entropy=False,
        )
    logp.sum().backward()
    monkeypatch.undo()
    return {n: p.grad.clone() for n, p in model.named_parameters()}, sum(saved)


def test_exact_training_recomputes_float64_intermediates_with_bitwise_equal_gradients(
    monkeypatch,
):
    plain, plain_saved = _loss_and_saved(recompute=False, monkeypatch=monkeypatch)
    ours, ours_saved = _loss_and_saved(recompute=True, monkeypatch=monkeypatch)
    assert plain.keys() == ours.keys()
    for name, grad in plain.items():
        assert torch.equal(grad, ours[name]), name
    assert plain_saved > 0
    assert ours_saved < plain_saved / 4, (ours_saved, plain_saved)


@pytest.mark.parametrize("exact", [False, True])
def test_recomputed_runs_the_op_directly_without_autograd(exact):
    from fp8rl.kernels.invariant import silu_mul
    from fp8rl.workers.model.recompute import recomputed

    gate, up = torch.randn(4, 8), torch.randn(4, 8)
    with torch.no_grad():
        out = recomputed(silu_mul, gate, up, exact=exact)
    assert torch.equal(out, silu_mul(gate, up, exact=exact))
    assert out.grad_fn is None
