"""Build a Decoder for a role: trainer (master weights), engine/reference (inference, FP8 codes)."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from fp8rl.protocol import ModelSpec, PrecisionSpec
from fp8rl.workers.model.config import DecoderConfig
from fp8rl.workers.model.decoder import Decoder
from fp8rl.workers.model.linear import LayerPrecision

DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32}


def layer_precision(
    model: ModelSpec, precision: PrecisionSpec, *, role: str, trainable: bool
) -> LayerPrecision:
    """The LayerPrecision of a worker: the trainer runs FP8 only in unified_fp8, engines whenever
    the mode quantizes rollout (DESIGN.md §3 table)."""
    fp8 = precision.trainer_fp8 if role in ("trainer", "reference") else precision.rollout_fp8
    return LayerPrecision(
        dtype=DTYPES[model.dtype],
        fp8=fp8,
        quant=precision.quant if fp8 else None,
        exact=precision.exact,
        trainable=trainable,
        kv_fp8=fp8 and precision.quant.kv_cache_dtype == "fp8_e4m3",
    )


def build_decoder(
    config: DecoderConfig,
    precision: LayerPrecision,
    *,
    state_dict: dict[str, Tensor] | None,
    max_positions: int,
    param_dtype: torch.dtype,
    device: torch.device | str = "cpu",
    seed: int = 0,
) -> Decoder:
    """Create the decoder, load ``state_dict`` (or keep a seeded random init), move to ``device``.

    For inference (``precision.trainable=False``) FP8 layers are then frozen into FP8 codes +
    scales, quantized once from the loaded weights (the engine's version-0 weights; the trainer's
    first weight update replaces them with its own codes).

    Raises:
        ValueError: the state dict misses or has extra parameters (names listed).
    """
    torch.manual_seed(seed)
    with torch.device(device):
        model = Decoder(config, precision, max_positions=max_positions)
    if state_dict is not None:
        load_weights(model, state_dict)
    if not precision.trainable:
        freeze_fp8(model)  # quantize from the loaded (full-precision) weights, not a rounded copy
        model.requires_grad_(False)
        model.eval()
    cast_dense(model, param_dtype)
    if not precision.trainable:
        model.fuse_projections()  # views into fused q/k/v, gate/up weights (fused blocks)
    return model


def cast_dense(model: nn.Module, dtype: torch.dtype) -> None:
    """Cast parameters (and FP8Linear biases) to ``dtype``; FP8 codes, scales and RoPE tables keep theirs.

    ``nn.Module.to(dtype)`` cannot be used: it would cast float8 codes and float32 scales too.
    """
    with torch.no_grad():
        for param in model.parameters():
            param.data = param.data.to(dtype)
        for module in model.modules():
            bias = getattr(module, "bias", None)
            if bias is not None and not isinstance(bias, nn.Parameter):
                module.bias = bias.to(dtype)


def load_weights(model: Decoder, state_dict: dict[str, Tensor]) -> None:
    """Copy a Hugging Face-named state dict into ``model`` (tied lm_head entries are ignored).

    Raises:
        ValueError: missing or unexpected names, or shape mismatches, listed.
    """
    own = dict(model.named_parameters())
    given = dict(state_dict)
    if model.config.tie_word_embeddings:
        given.pop("lm_head.weight", None)
    missing = sorted(set(own) - set(given))
    extra = sorted(set(given) - set(own))
    if missing or extra:
        raise ValueError(
            f"checkpoint does not match the model: missing {missing[:8]}, unexpected {extra[:8]}"
        )
    with torch.no_grad():
        for name, param in own.items():
            src = given[name]
            if tuple(src.shape) != tuple(param.shape):
                raise ValueError(
                    f"{name}: checkpoint shape {tuple(src.shape)} != model {tuple(param.shape)}"
                )
            param.copy_(src.to(param.dtype))


def freeze_fp8(model: nn.Module) -> None:
    """Replace every trainable FP8Linear by an inference FP8Linear holding its codes + scales."""
    from fp8rl.kernels import FP8Linear

    for parent in list(model.modules()):
        for child_name, child in list(parent.named_children()):
            if isinstance(child, FP8Linear) and getattr(child, "weight", None) is not None:
                frozen = FP8Linear.from_quantized(
                    child.quantized_weight(),
                    None if child.bias is None else child.bias.detach().clone(),
                    scale_format=child.scale_format,
                    exact=child.exact,
                )
                setattr(parent, child_name, frozen)
