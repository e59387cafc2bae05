"""The quantization contract shared by the trainer and every rollout engine.

The unified precision flow (Jet-RL, arXiv 2601.14243; DESIGN.md §2) only holds when both sides run
the *same* FP8 quantization. ``QuantConfig`` names every choice that changes the FP8 codes or
scales; its ``fingerprint()`` is what workers compare at start and what every weight update and
rollout result carries. Two configs with equal fingerprints produce bit-identical codes.
"""

from __future__ import annotations

import hashlib
import json
from typing import Literal

from pydantic import Field, field_validator

from fp8rl.protocol.base import StrictModel

FP8_E4M3_MAX = 448.0
"""Largest finite E4M3 value (OCP FP8 spec, ``float8_e4m3fn``)."""

SUPPORTED_GROUP = 128
"""The group/block edge every fp8rl kernel implements (1×128 activations, 128×128 weights)."""


class QuantConfig(StrictModel):
    """How tensors are quantized to FP8: granularity, scale rule, modules kept in BF16, KV cache."""

    fmt: Literal["e4m3"] = "e4m3"
    """FP8 element format. Only E4M3 (``float8_e4m3fn``, max 448) is used, for forward and backward."""

    fp8_max: float = FP8_E4M3_MAX
    """Largest magnitude a code may take; values are clamped to ±fp8_max before the cast."""

    activation_group: tuple[int, int] = (1, SUPPORTED_GROUP)
    """Activation scale granularity (rows, cols): 1×128 = one scale per token per 128 input features."""

    weight_block: tuple[int, int] = (SUPPORTED_GROUP, SUPPORTED_GROUP)
    """Weight scale granularity (out, in): one scale per 128×128 block of the [N, K] weight."""

    grad_group: tuple[int, int] = (1, SUPPORTED_GROUP)
    """Output-gradient scale granularity for DGrad/WGrad: 1×128 along the contraction dimension."""

    scale_format: Literal["fp32", "pow2"] = "fp32"
    """``fp32``: scale = amax/448 in float32. ``pow2``: that scale rounded up to a power of two (UE8M0)."""

    bf16_modules: list[str] = Field(default_factory=lambda: ["embed_tokens", "lm_head"])
    """Module name suffixes kept in BF16 (never quantized). Attention math, norms and softmax are always BF16/FP32."""

    bf16_first_blocks: int = Field(default=0, ge=0)
    """Number of leading decoder blocks whose linear layers stay in BF16."""

    bf16_last_blocks: int = Field(default=0, ge=0)
    """Number of trailing decoder blocks whose linear layers stay in BF16."""

    kv_cache_dtype: Literal["auto", "fp8_e4m3"] = "auto"
    """KV cache storage: ``auto`` = the model's compute dtype; ``fp8_e4m3`` = FP8 with per-tensor scales."""

    kv_scale_policy: Literal["recalibrate_each_step"] = "recalibrate_each_step"
    """How FP8 KV scales are set: measured by the trainer every step and shipped with the weights."""

    @field_validator("activation_group", "grad_group")
    @classmethod
    def _check_group(cls, value: tuple[int, int]) -> tuple[int, int]:
        if tuple(value) != (1, SUPPORTED_GROUP):
            raise ValueError(f"only (1, {SUPPORTED_GROUP}) is implemented, got {tuple(value)}")
        return value

    @field_validator("weight_block")
    @classmethod
    def _check_block(cls, value: tuple[int, int]) -> tuple[int, int]:
        if tuple(value) != (SUPPORTED_GROUP, SUPPORTED_GROUP):
            raise ValueError(
                f"only ({SUPPORTED_GROUP}, {SUPPORTED_GROUP}) is implemented, got {tuple(value)}"
            )
        return value

    @field_validator("fp8_max")
    @classmethod
    def _check_max(cls, value: float) -> float:
        if not 0 < value <= FP8_E4M3_MAX:
            raise ValueError(f"must be in (0, {FP8_E4M3_MAX}] for E4M3, got {value}")
        return value

    @field_validator("bf16_modules")
    @classmethod
    def _canonical_modules(cls, value: list[str]) -> list[str]:
        return sorted(set(value))

    def canonical_json(self) -> str:
        """The config as JSON with sorted keys and no whitespace (the fingerprint's input)."""
        return json.dumps(self.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))

    def fingerprint(self) -> str:
        """First 16 hex digits of the SHA-256 of ``canonical_json()``.

        Key order in the source YAML never changes it; any field change does.
        """
        return hashlib.sha256(self.canonical_json().encode()).hexdigest()[:16]

    def differing_fields(self, other: QuantConfig) -> list[str]:
        """Names of the fields whose values differ from ``other`` (for handshake errors)."""
        mine, theirs = self.model_dump(mode="json"), other.model_dump(mode="json")
        return sorted(key for key in mine if mine[key] != theirs.get(key))


PrecisionMode = Literal["bf16", "fp8_rollout", "unified_fp8"]


class PrecisionSpec(StrictModel):
    """Which precision the trainer and the rollout run in (DESIGN.md §3)."""

    mode: PrecisionMode = "unified_fp8"
    """``bf16``: baseline. ``fp8_rollout``: BF16 trainer, FP8 rollout (the mismatched shortcut).
    ``unified_fp8``: trainer forward and rollout run the same FP8 quantization (Jet-RL)."""

    exact: bool = False
    """Batch-invariant kernels on both sides, so rollout logprobs equal the trainer's bit for bit."""

    quant: QuantConfig = Field(default_factory=QuantConfig)
    """The FP8 quantization contract (ignored in ``bf16`` mode)."""

    @property
    def trainer_fp8(self) -> bool:
        """True when the trainer's forward runs in FP8."""
        return self.mode == "unified_fp8"

    @property
    def rollout_fp8(self) -> bool:
        """True when the rollout engine runs in FP8."""
        return self.mode in ("fp8_rollout", "unified_fp8")
