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
        head, grad_sum = model.head()
        logp, entropy = chunked_logprobs(
            head, h, tokens, temperature=temperature, exact=exact, with_entropy=True,
            grad_sum=grad_sum,
        )  # fmt: skip
        with torch.no_grad():  # the engine: BF16 head weights, the plain rows
            engine = token_logprobs(
                model.logits(hidden), tokens, temperature=temperature, exact=exact
            )
        assert torch.equal(logp, engine)
        assert bool((entropy >= 0).all()) and bool(torch.isfinite(entropy).all())
        (logp.sum() + entropy.sum()).backward()
        assert torch.isfinite(h.grad).all()


@pytest.mark.parametrize("preset", ["tiny-llama", "small-llama"])
@pytest.mark.parametrize("exact", [False, True])
def test_head_gradient_summed_over_chunks_in_fp32_is_as_close_to_float64(preset, exact):
    """``Decoder.head()``'s ``GradSum`` (each chunk's ∇W GEMM writing FP32 into one buffer,
    cuBLAS β = 1) against the per-chunk BF16 ∇W added by autograd, both against float64."""
    cfg = dataclasses.replace(PRESETS[preset], num_hidden_layers=1)
    precision = LayerPrecision(dtype=torch.bfloat16, fp8=False, quant=None, exact=exact)
    model = build_decoder(
        cfg, precision, state_dict=None, max_positions=64, param_dtype=torch.float32,
        device="cuda",
    )  # fmt: skip
    tied = cfg.tie_word_embeddings
    weight = model.model.embed_tokens.weight if tied else model.lm_head.weight
    gen = torch.Generator(device="cuda").manual_seed(0)
    hidden = torch.randn(2000, cfg.hidden_size, device="cuda", dtype=torch.bfloat16, generator=gen)
    tokens = torch.randint(0, cfg.vocab_size, (2000,), device="cuda", generator=gen)

    def weight_grad(make):
        fn, grad_sum = make()
        logp, _ = chunked_logprobs(
            fn, hidden.clone().requires_grad_(True), tokens, temperature=1.0, exact=exact,
            chunk=512, grad_sum=grad_sum,
        )  # fmt: skip
        logp.sum().backward()
        grad, weight.grad = weight.grad, None
        return grad, grad_sum

    summed, grad_sum = weight_grad(model.head)
    per_chunk, _ = weight_grad(lambda: (model.logits, None))
    assert grad_sum is not None and grad_sum.total is None and summed.dtype == torch.float32
    w64 = weight.detach().to(torch.bfloat16).double().requires_grad_(True)
    logp = torch.log_softmax(hidden.double() @ w64.t(), -1).gather(1, tokens[:, None])
    (ref,) = torch.autograd.grad(logp.sum(), w64)
    errors = [float((g.double() - ref).abs().max() / ref.abs().max()) for g in (summed, per_chunk)]
    assert errors[0] < 2e-2 and errors[0] <= 1.1 * errors[1], errors
