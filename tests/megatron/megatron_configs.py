"""Tiny architectures for the Megatron tests (small vocabularies keep them fast on CPU)."""

from __future__ import annotations

import torch

from fp8rl.workers.model.config import DecoderConfig
from fp8rl.workers.model.decoder import Decoder
from fp8rl.workers.model.linear import LayerPrecision
from fp8rl.workers.ports import free_port  # noqa: F401  (the tests import it from here)

TINY_LLAMA = DecoderConfig(  # tied embeddings, GQA 2:1, head_dim 64
    vocab_size=300,
    hidden_size=128,
    intermediate_size=256,
    num_hidden_layers=2,
    num_attention_heads=2,
    num_key_value_heads=1,
    head_dim=64,
    rms_norm_eps=1e-5,
    rope_theta=10000.0,
    tie_word_embeddings=True,
    model_type="llama",
)
TINY_QWEN2 = DecoderConfig(  # q/k/v biases, untied head, 2 KV groups
    vocab_size=301,
    hidden_size=256,
    intermediate_size=256,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=64,
    rms_norm_eps=1e-6,
    rope_theta=1000000.0,
    attention_bias=True,
    model_type="qwen2",
)
TP2_LLAMA = DecoderConfig(  # every TP=2 shard is whole 128×128 blocks
    vocab_size=256,
    hidden_size=256,
    intermediate_size=512,
    num_hidden_layers=2,
    num_attention_heads=2,
    num_key_value_heads=2,
    head_dim=128,
    rms_norm_eps=1e-5,
    tie_word_embeddings=False,
    model_type="llama",
)


def hf_state(config: DecoderConfig, seed: int = 0) -> dict[str, torch.Tensor]:
    """A random HF-named float32 state dict (the native decoder's initialisation, biases random)."""
    torch.manual_seed(seed)
    model = Decoder(config, LayerPrecision(dtype=torch.float32), max_positions=64)
    state = {k: v.detach().clone() for k, v in model.named_parameters()}
    for name, tensor in state.items():
        if name.endswith(("bias", "norm.weight", "layernorm.weight")):
            tensor.normal_(1.0 if "norm" in name else 0.0, 0.1)
    return state
