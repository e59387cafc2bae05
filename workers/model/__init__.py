"""The shared decoder, its configuration and model/tokenizer loading."""

from fp8rl.workers.model.config import PRESETS, DecoderConfig, config_from_hf
from fp8rl.workers.model.decoder import Decoder, KVCache
from fp8rl.workers.model.linear import DenseLinear, LayerPrecision, make_linear

__all__ = [
    "PRESETS",
    "Decoder",
    "DecoderConfig",
    "DenseLinear",
    "KVCache",
    "LayerPrecision",
    "config_from_hf",
    "make_linear",
]
