"""The Megatron GPTModel scores responses exactly as the native decoder (TP = PP = 1, CPU)."""

from __future__ import annotations

import pytest
import torch
from megatron_configs import TINY_LLAMA, TINY_QWEN2, hf_state

from fp8rl.protocol import QuantConfig
from fp8rl.workers.model.build import build_decoder
from fp8rl.workers.model.linear import LayerPrecision
from fp8rl.workers.model.scoring import pack
from fp8rl.workers.model.scoring import response_logprobs as native_logprobs
from fp8rl.workers.trainer.megatron.logprobs import response_logprobs
from fp8rl.workers.trainer.megatron.model import build_gpt_model, load_hf_weights


def _batch(vocab: int):
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(0, vocab, (n,), generator=g).tolist() for n in (5, 9, 3)]
    responses = [torch.randint(0, vocab, (n,), generator=g).tolist() for n in (7, 2, 11)]
    return pack(prompts, responses)


def _models(config, precision):
    hf = hf_state(config)
    native = build_decoder(
        config, precision, state_dict=hf, max_positions=64, param_dtype=torch.float32
    )
    megatron = build_gpt_model(config, precision, max_positions=64)
    load_hf_weights(megatron, hf)
    return native, megatron


@pytest.mark.parametrize(
    ("config", "fp8", "exact"),
    [
        (TINY_LLAMA, True, True),
        (TINY_LLAMA, True, False),
        (TINY_QWEN2, True, True),
        (TINY_QWEN2, False, False),
    ],
    ids=["llama-fp8-exact", "llama-fp8-fast", "qwen2-fp8-exact", "qwen2-bf16-fast"],
)
def test_megatron_logprobs_equal_native_bitwise(single_rank, config, fp8, exact):
    precision = LayerPrecision(
        dtype=torch.bfloat16, fp8=fp8, quant=QuantConfig() if fp8 else None, exact=exact
    )
    native, megatron = _models(config, precision)
    batch = _batch(config.vocab_size)
    with torch.no_grad():
        expected = native_logprobs(native, batch, temperature=0.7)
        got = response_logprobs(megatron, batch, temperature=0.7)
    assert torch.equal(got, expected), (got - expected).abs().max()


def test_megatron_policy_gradient_matches_native_within_fp8_noise(single_rank):
    config = TINY_QWEN2
    precision = LayerPrecision(dtype=torch.bfloat16, fp8=True, quant=QuantConfig(), exact=True)
    native, megatron = _models(config, precision)
    batch = _batch(config.vocab_size)
    advantages = torch.linspace(-1, 1, batch.response_ids.numel()).view_as(batch.response_ids)
    for model, score in ((native, native_logprobs), (megatron, response_logprobs)):
        loss = -(score(model, batch, temperature=1.0) * advantages).sum()
        loss.backward()
    grads = {
        "up": (
            native.model.layers[1].mlp.up_proj.weight.grad,
            megatron.decoder.layers[1].mlp.linear_fc1.weight.grad[256:],
        ),
        "k": (
            native.model.layers[0].self_attn.k_proj.weight.grad[:64],  # k of group 0
            megatron.decoder.layers[0].self_attention.linear_qkv.weight.grad[128:192],
        ),
        "embed": (
            native.model.embed_tokens.weight.grad,
            megatron.embedding.word_embeddings.weight.grad,
        ),
    }
    for name, (a, b) in grads.items():
        assert a.abs().sum() > 0, name
        rel = (a - b).norm() / a.norm()
        assert rel < 2e-2, (name, float(rel))
