"""Decoder hyper-parameters for the Llama 3.x, Qwen2.5 and Qwen3 families, read from HF configs.

One dataclass covers all three: they differ only in biases on q/k/v (Qwen2.5), per-head RMSNorm
on q and k (Qwen3), RoPE scaling (Llama 3.1's ``llama3`` rule) and tied embeddings.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
from torch import Tensor

SUPPORTED_MODEL_TYPES = ("llama", "qwen2", "qwen3", "mistral")


@dataclass(frozen=True)
class DecoderConfig:
    """Shape and flavour of a decoder-only transformer (Hugging Face field names where they exist)."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: dict[str, Any] | None = None
    max_position_embeddings: int = 4096
    tie_word_embeddings: bool = False
    attention_bias: bool = False
    qk_norm: bool = False
    model_type: str = "llama"
    bos_token_id: int | None = None
    eos_token_id: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(
                f"num_attention_heads ({self.num_attention_heads}) must be a multiple of "
                f"num_key_value_heads ({self.num_key_value_heads})"
            )

    def to_dict(self) -> dict[str, Any]:
        """Plain dict (JSON-able) of every field."""
        return asdict(self)

    def inv_freq(self) -> Tensor:
        """RoPE inverse frequencies [head_dim/2] (float64), with Llama 3.1 scaling when configured."""
        dim = self.head_dim
        inv = 1.0 / (self.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))
        scaling = self.rope_scaling or {}
        kind = scaling.get("rope_type", scaling.get("type", "default"))
        if kind == "llama3":
            inv = _llama3_scaling(inv, scaling)
        elif kind == "linear":
            inv = inv / float(scaling["factor"])
        elif kind not in ("default", None):
            raise ValueError(
                f"rope_scaling type {kind!r} is not supported (default, linear, llama3)"
            )
        return inv

    def hf_config(self) -> dict[str, Any]:
        """A Hugging Face ``config.json`` dict for this architecture (used by exports)."""
        arch = {
            "llama": "LlamaForCausalLM",
            "qwen2": "Qwen2ForCausalLM",
            "qwen3": "Qwen3ForCausalLM",
            "mistral": "MistralForCausalLM",
        }[self.model_type]
        cfg = {
            "architectures": [arch],
            "model_type": self.model_type,
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_hidden_layers,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "head_dim": self.head_dim,
            "rms_norm_eps": self.rms_norm_eps,
            "rope_theta": self.rope_theta,
            "rope_scaling": self.rope_scaling,
            "max_position_embeddings": self.max_position_embeddings,
            "tie_word_embeddings": self.tie_word_embeddings,
            "hidden_act": "silu",
            "bos_token_id": self.bos_token_id,
            "eos_token_id": self.eos_token_id[0]
            if len(self.eos_token_id) == 1
            else self.eos_token_id,
        }
        if self.model_type == "llama":
            cfg["attention_bias"] = self.attention_bias
            cfg["mlp_bias"] = False
        return cfg


def _llama3_scaling(inv_freq: Tensor, scaling: dict[str, Any]) -> Tensor:
    """Llama 3.1 RoPE frequency rule (Meta's reference ``apply_scaling``; HF ``_compute_llama3_parameters``)."""
    factor = float(scaling["factor"])
    low = float(scaling.get("low_freq_factor", 1.0))
    high = float(scaling.get("high_freq_factor", 4.0))
    old_len = float(scaling.get("original_max_position_embeddings", 8192))
    low_wavelen, high_wavelen = old_len / low, old_len / high
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_len / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
    return torch.where(medium, smoothed, scaled)


REQUIRED_HF_KEYS = (
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
)
"""``config.json`` keys without a default in ``config_from_hf``."""


def config_from_hf(cfg: dict[str, Any]) -> DecoderConfig:
    """Build a DecoderConfig from a Hugging Face ``config.json`` dict.

    Raises:
        ValueError: unsupported ``model_type`` (Llama, Mistral, Qwen2/2.5 and Qwen3 are supported),
            or a size key missing (``REQUIRED_HF_KEYS``).
    """
    model_type = cfg.get("model_type", "llama")
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise ValueError(
            f"model_type {model_type!r} is not supported; fp8rl's decoder covers {SUPPORTED_MODEL_TYPES}"
        )
    missing = [key for key in REQUIRED_HF_KEYS if key not in cfg]
    if missing:
        raise ValueError(f"config.json lacks {', '.join(missing)}: the decoder's sizes are unknown")
    heads = cfg["num_attention_heads"]
    rope = cfg.get("rope_scaling")
    params = cfg.get("rope_parameters") or {}
    if rope is None and params.get("rope_type", "default") != "default":
        rope = params
    eos = cfg.get("eos_token_id")
    return DecoderConfig(
        vocab_size=cfg["vocab_size"],
        hidden_size=cfg["hidden_size"],
        intermediate_size=cfg["intermediate_size"],
        num_hidden_layers=cfg["num_hidden_layers"],
        num_attention_heads=heads,
        num_key_value_heads=cfg.get("num_key_value_heads") or heads,
        head_dim=cfg.get("head_dim") or cfg["hidden_size"] // heads,
        rms_norm_eps=cfg.get("rms_norm_eps", 1e-6),
        rope_theta=cfg.get("rope_theta", params.get("rope_theta", 10000.0)),
        rope_scaling=rope,
        max_position_embeddings=cfg.get("max_position_embeddings", 4096),
        tie_word_embeddings=cfg.get("tie_word_embeddings", False),
        attention_bias=cfg.get("attention_bias", model_type == "qwen2"),
        qk_norm=model_type == "qwen3",
        model_type=model_type,
        bos_token_id=cfg.get("bos_token_id"),
        eos_token_id=[] if eos is None else ([eos] if isinstance(eos, int) else list(eos)),
    )


PRESETS: dict[str, DecoderConfig] = {
    # Tiny random models (SmolLM2's tokenizer vocabulary) for tests.
    "tiny-llama": DecoderConfig(
        vocab_size=49152,
        hidden_size=128,
        intermediate_size=384,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=64,
        rms_norm_eps=1e-5,
        rope_theta=100000.0,
        max_position_embeddings=2048,
        tie_word_embeddings=True,
        model_type="llama",
        bos_token_id=1,
        eos_token_id=[2],
    ),
    "tiny-qwen3": DecoderConfig(
        vocab_size=49152,
        hidden_size=192,
        intermediate_size=320,
        num_hidden_layers=2,
        num_attention_heads=3,
        num_key_value_heads=1,
        head_dim=64,
        rms_norm_eps=1e-6,
        rope_theta=1000000.0,
        max_position_embeddings=2048,
        tie_word_embeddings=False,
        qk_norm=True,
        model_type="qwen3",
        bos_token_id=1,
        eos_token_id=[2],
    ),
    "small-llama": DecoderConfig(
        vocab_size=32000,
        hidden_size=1024,
        intermediate_size=2816,
        num_hidden_layers=8,
        num_attention_heads=16,
        num_key_value_heads=4,
        head_dim=64,
        rms_norm_eps=1e-5,
        rope_theta=500000.0,
        max_position_embeddings=4096,
        model_type="llama",
        bos_token_id=1,
        eos_token_id=[2],
    ),
    # Full-size shapes (random weights) for speed benchmarks.
    "llama-3.1-8b": DecoderConfig(
        vocab_size=128256,
        hidden_size=4096,
        intermediate_size=14336,
        num_hidden_layers=32,
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=128,
        rms_norm_eps=1e-5,
        rope_theta=500000.0,
        max_position_embeddings=131072,
        model_type="llama",
        rope_scaling={
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
        },
        bos_token_id=128000,
        eos_token_id=[128001, 128009],
    ),
    "qwen2.5-7b": DecoderConfig(
        vocab_size=152064,
        hidden_size=3584,
        intermediate_size=18944,
        num_hidden_layers=28,
        num_attention_heads=28,
        num_key_value_heads=4,
        head_dim=128,
        rms_norm_eps=1e-6,
        rope_theta=1000000.0,
        max_position_embeddings=32768,
        attention_bias=True,
        model_type="qwen2",
        bos_token_id=151643,
        eos_token_id=[151645, 151643],
    ),
}
"""Named architectures for ``model.path: random:<name>``."""
