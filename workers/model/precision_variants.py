"""BF16 engines with exactly one FP8 ingredient switched on, for mismatch attribution.

The FP8 rollout of ``fp8_rollout`` differs from the BF16 trainer in four ways at once: weight
quantization (128×128 blocks), activation quantization (1×128 groups before every FP8 GEMM),
the FP8 KV cache (per-tensor scales) and, without ``precision.exact``, fast kernels whose
reductions depend on the batch. Each variant here is a BF16 decoder with one of them alone:

* ``weights``: the FP8 linears' weights replaced by their dequantized ``per_block_quant``
  codes (the values the FP8 engine multiplies), activations left in BF16;
* ``activations``: BF16 weights; the input of every would-be FP8 linear goes through the 1×128
  FP8 round trip (``per_token_group_quant`` then dequantize);
* ``kv_cache``: the BF16 model with the FP8 KV cache, scales calibrated on the prompts;
* ``kernels``: the BF16 model with fast (``exact=False``) kernels.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import torch
from torch import Tensor, nn

from fp8rl.kernels import per_block_quant, per_token_group_quant
from fp8rl.workers.model.build import build_decoder
from fp8rl.workers.model.config import DecoderConfig
from fp8rl.workers.model.linear import LayerPrecision

VARIANTS = ("weights", "activations", "kv_cache", "kernels")


def fp8_linear_modules(
    state_dict: dict[str, Tensor], fp8: LayerPrecision, num_blocks: int
) -> list[str]:
    """Names of the linear modules (2-D ``<m>.weight``, not embeddings) FP8 under ``fp8``."""
    return [
        name.removesuffix(".weight")
        for name, t in state_dict.items()
        if name.endswith(".weight") and t.dim() == 2 and "embed_tokens" not in name
        and fp8.linear_is_fp8(name.removesuffix(".weight"), num_blocks)
    ]  # fmt: skip


def weights_through_fp8(
    state_dict: dict[str, Tensor], modules: Sequence[str], *, scale_format: str = "fp32"
) -> dict[str, Tensor]:
    """``state_dict`` with each of ``modules``' weights replaced by its block-FP8 dequantization
    (float32 ``codes * scale``, the values the FP8 engine multiplies)."""
    out = dict(state_dict)
    for module in modules:
        weight = state_dict[f"{module}.weight"].float()
        out[f"{module}.weight"] = per_block_quant(weight, scale_format=scale_format).dequantize(
            torch.float32
        )
    return out


def activation_round_trip(x: Tensor, *, scale_format: str = "fp32") -> Tensor:
    """``x [..., K]`` through the 1×128 FP8 activation quantizer and back, in ``x.dtype``."""
    return per_token_group_quant(x, scale_format=scale_format).dequantize(x.dtype)


def quantize_activations_of(
    model: nn.Module, modules: Sequence[str], *, scale_format: str = "fp32"
) -> int:
    """Add a forward pre-hook to each of ``modules`` (dense linears) that FP8-round-trips its
    input; returns the number of hooks added."""
    wanted = set(modules)
    count = 0
    for name, module in model.named_modules():
        if name in wanted:
            module.register_forward_pre_hook(
                lambda _m, args: (activation_round_trip(args[0], scale_format=scale_format),)
            )
            count += 1
    return count


@torch.no_grad()
def calibrate_kv_scales(model: nn.Module, prompts: Sequence[Sequence[int]]) -> None:
    """Per-tensor FP8 KV scales of ``model`` (built with ``kv_fp8``) from one forward over each
    prompt, as the trainer calibrates them."""
    attns = [m for m in model.modules() if getattr(m, "kv_fp8", False)]
    for attn in attns:
        attn.k_scale.fill_(1.0)
        attn.v_scale.fill_(1.0)
        attn.observe_kv = True
    device = next(model.parameters()).device
    for ids in prompts:
        tokens = torch.tensor([list(ids)], device=device)
        model(tokens, torch.arange(len(ids), device=device)[None], torch.tensor([len(ids)]))
    for attn in attns:
        attn.observe_kv = False
        attn.recalibrate_kv()


def build_variant(
    variant: str,
    config: DecoderConfig,
    state_dict: dict[str, Tensor],
    *,
    bf16: LayerPrecision,
    fp8: LayerPrecision,
    prompts: Sequence[Sequence[int]],
    max_positions: int,
    device: torch.device | str = "cpu",
) -> nn.Module:
    """An inference BF16 decoder with FP8 ingredient ``variant`` (one of ``VARIANTS``) alone.

    ``bf16``: the trainer's dense precision (its ``exact`` flag is kept except for ``kernels``);
    ``fp8``: the FP8 precision whose QuantConfig picks the FP8 linears and the scale format.
    Raises ``ValueError`` for an unknown variant.
    """
    if variant not in VARIANTS:
        raise ValueError(f"unknown attribution variant {variant!r}; choose from {VARIANTS}")
    engine = replace(bf16, trainable=False)
    modules = fp8_linear_modules(state_dict, fp8, config.num_hidden_layers)
    scale_format = fp8.quant.scale_format
    weights = state_dict
    if variant == "weights":
        weights = weights_through_fp8(state_dict, modules, scale_format=scale_format)
    elif variant == "kv_cache":
        engine = replace(engine, kv_fp8=True)
    elif variant == "kernels":
        engine = replace(engine, exact=False)
    model = build_decoder(
        config,
        engine,
        state_dict=weights,
        max_positions=max_positions,
        param_dtype=bf16.dtype,
        device=device,
    )
    if variant == "activations":
        quantize_activations_of(model, modules, scale_format=scale_format)
    elif variant == "kv_cache":
        calibrate_kv_scales(model, prompts)
    return model
