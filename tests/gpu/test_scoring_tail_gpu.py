"""GPU: the trainer's scoring tail (the FP32 head cast once per pass, log-probabilities with the
entropy in one Triton pass) scores tokens bitwise as the engine does (its BF16 head, the plain
log-probability rows), in both precision modes, tied and untied heads."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from fp8rl.kernels.invariant import token_logprobs
from fp8rl.protocol import QuantConfig
from fp8rl.workers.model.build import build_decoder
from fp8rl.workers.model.config import PRESETS
from fp8rl.workers.model.linear import LayerPrecision
from fp8rl.workers.model.logprob import chunked_logprobs

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


@pytest.mark.parametrize("preset", ["tiny-llama", "small-llama"])
@pytest.mark.parametrize("mode", ["bf16", "unified_fp8"])
@pytest.mark.parametrize("exact", [False, True])
def test_training_tail_scores_tokens_bitwise_as_the_engine(preset, mode, exact):
    fp8 = mode == "unified_fp8"
    precision = LayerPrecision(
        dtype=torch.bfloat16, fp8=fp8, quant=QuantConfig() if fp8 else None, exact=exact
    )
    cfg = dataclasses.replace(PRESETS[preset], num_hidden_layers=2)
    model = build_decoder(
        cfg, precision, state_dict=None, max_positions=512, param_dtype=torch.float32,
        device="cuda",
    )  # fmt: skip
    gen = torch.Generator(device="cuda").manual_seed(0)
    ids = torch.randint(0, cfg.vocab_size, (3, 300), device="cuda", generator=gen)
    pos = torch.arange(300, device="cuda").expand(3, 300)
    hidden = model(ids, pos, torch.full((3,), 300, device="cuda")).detach()
    tokens = torch.randint(0, cfg.vocab_size, (3, 300), device="cuda", generator=gen)
    for temperature in (1.0, 0.7, 0.0):
        h = hidden.clone().requires_grad_(True)
        logp, entropy = chunked_logprobs(
            model.head(), h, tokens, temperature=temperature, exact=exact, with_entropy=True
        )
        with torch.no_grad():  # the engine: BF16 head weights, the plain rows
            engine = token_logprobs(
                model.logits(hidden), tokens, temperature=temperature, exact=exact
            )
        assert torch.equal(logp, engine)
        assert bool((entropy >= 0).all()) and bool(torch.isfinite(entropy).all())
        (logp.sum() + entropy.sum()).backward()
        assert torch.isfinite(h.grad).all()
