"""A tied vocabulary head's weight gradient is summed in the embedding's backward
(``workers/model/tied_grad.py``), so autograd does not hold the head's whole [V, H] gradient
through the decoder backward: the tied weight's gradient stays bitwise the same (the quickstart
trainer's peak memory, issue 18)."""

from __future__ import annotations

from dataclasses import replace
from functools import partial

import pytest
import torch

from fp8rl.kernels import dense_exact, invariant
from fp8rl.kernels.dense_exact import DeferredWeightGrad
from fp8rl.protocol import QuantConfig
from fp8rl.workers.model import decoder as decoder_module
from fp8rl.workers.model import logprob
from fp8rl.workers.model.build import build_decoder
from fp8rl.workers.model.config import PRESETS
from fp8rl.workers.model.linear import LayerPrecision

CONFIG = replace(
    PRESETS["tiny-qwen3"], vocab_size=512, num_hidden_layers=1, tie_word_embeddings=True
)


def _grads(*, defer: bool, monkeypatch, chunk: int) -> tuple[dict, list[int]]:
    """Gradients after two accumulated micro-batches (repeated tokens, two lm_head chunks), and
    how many head gradients were deferred."""
    monkeypatch.setattr(dense_exact, "ROWS", 96)  # 512 rows: 5 full blocks and a partial one
    monkeypatch.setattr(invariant, "MIN_ELEMENTS", 1)
    monkeypatch.setattr(decoder_module, "defers_head_grad", lambda w, exact: defer and exact)
    monkeypatch.setattr(logprob, "chunked_logprobs", partial(logprob.chunked_logprobs, chunk=chunk))
    added = []
    real_add = DeferredWeightGrad.add
    monkeypatch.setattr(
        DeferredWeightGrad, "add", lambda s, g, x: added.append(1) or real_add(s, g, x)
    )
    precision = LayerPrecision(
        dtype=torch.bfloat16, fp8=True, quant=QuantConfig(), exact=True, trainable=True
    )
    model = build_decoder(
        CONFIG, precision, state_dict=None, max_positions=64, param_dtype=torch.float32, seed=1
    )
    gen = torch.Generator().manual_seed(0)
    for _ in range(2):
        ids = torch.randint(0, 40, (3, 12), generator=gen)  # 36 tokens of 40 ids: repeats
        logp, _ = model.score_responses(
            ids,
            torch.arange(12).expand(3, 12),
            torch.tensor([12, 10, 7]),
            torch.tensor([5, 4, 3]),
            ids[:, 5:9],
            temperature=1.0,
            with_entropy=False,
        )
        scale = 10.0 ** torch.randint(-6, 7, logp.shape, generator=gen)  # order-sensitive sums
        (logp * torch.randn(logp.shape, generator=gen) * scale).sum().backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    monkeypatch.undo()
    return grads, added


@pytest.mark.parametrize("chunk", [1024, 5])
def test_a_tied_heads_gradient_summed_in_the_embedding_backward_is_bitwise_autograds(
    monkeypatch, chunk
):
    plain, plain_added = _grads(defer=False, monkeypatch=monkeypatch, chunk=chunk)
    ours, ours_added = _grads(defer=True, monkeypatch=monkeypatch, chunk=chunk)
    assert not plain_added and len(ours_added) == 2 * (1 if chunk == 1024 else 3)
    assert plain.keys() == ours.keys()
    for name in plain:
        same = plain[name].view(torch.int32) == ours[name].view(torch.int32)
        assert same.all(), name


def test_a_head_gradient_after_the_sum_is_refused():
    holder = DeferredWeightGrad()
    assert holder.total(torch.zeros(4, 2)) is None
    with pytest.raises(RuntimeError, match="after it was summed"):
        holder.add(torch.zeros(1, 4), torch.zeros(1, 2))
