"""Which tensors a weight update carries for a given model: FP8 codes + block scales per FP8
linear, dense tensors for everything else (embeddings, norms, biases, BF16-kept layers).

Both sides derive the list from the same decoder definition, so the trainer's payload names and
the engine's expected names agree by construction; the receiver still checks them one by one.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

SCALE_SUFFIX = ".weight_scale_inv"
"""Block scales travel as ``<module>.weight_scale_inv`` (dequantization multipliers, HF/DeepSeek FP8 naming)."""


@dataclass(frozen=True)
class SlotSpec:
    """What the receiver expects for one tensor of an update."""

    name: str
    role: str  # "fp8_weight" | "weight_scale" | "dense"
    shape: tuple[int, ...]
    dtype: torch.dtype


def is_fp8_linear(module: nn.Module) -> bool:
    """True for fp8rl's FP8Linear (trainable or inference form)."""
    from fp8rl.kernels import FP8Linear

    return isinstance(module, FP8Linear)


def fp8_shapes(out_features: int, in_features: int) -> tuple[tuple[int, int], tuple[int, int]]:
    """Shapes of the codes [N, K] and of the 128×128 scale grid [ceil(N/128), ceil(K/128)]."""
    return (out_features, in_features), (-(-out_features // 128), -(-in_features // 128))


def engine_slots(model: nn.Module) -> dict[str, SlotSpec]:
    """The tensors an engine/reference model (inference precision) accepts, by name."""
    slots: dict[str, SlotSpec] = {}
    for prefix, module in model.named_modules():
        if is_fp8_linear(module):
            codes, scales = fp8_shapes(module.out_features, module.in_features)
            slots[f"{prefix}.weight"] = SlotSpec(
                f"{prefix}.weight", "fp8_weight", codes, torch.float8_e4m3fn
            )
            slots[f"{prefix}{SCALE_SUFFIX}"] = SlotSpec(
                f"{prefix}{SCALE_SUFFIX}", "weight_scale", scales, torch.float32
            )
            if module.bias is not None:
                slots[f"{prefix}.bias"] = SlotSpec(
                    f"{prefix}.bias", "dense", tuple(module.bias.shape), module.bias.dtype
                )
            continue
        if any(is_fp8_linear(m) for m in _ancestors(model, prefix)):
            continue
        for pname, param in module.named_parameters(recurse=False):
            name = f"{prefix}.{pname}" if prefix else pname
            slots[name] = SlotSpec(name, "dense", tuple(param.shape), param.dtype)
        for bname in KV_SCALES:
            if getattr(module, "kv_fp8", False):
                name = f"{prefix}.{bname}"
                slots[name] = SlotSpec(name, "kv_scale", (), torch.float32)
    return slots


KV_SCALES = ("k_scale", "v_scale")
"""Per-tensor FP8 KV-cache scale buffers of an attention module (shipped with the weights)."""


def _ancestors(model: nn.Module, prefix: str) -> list[nn.Module]:
    parts = prefix.split(".") if prefix else []
    out, node = [], model
    for p in parts[:-1]:
        node = getattr(node, p)
        out.append(node)
    return out


def engine_tensor(model: nn.Module, name: str) -> Tensor:
    """The live tensor behind slot ``name`` in an inference model (what an update overwrites)."""
    module_name, _, leaf = name.rpartition(".")
    module = model.get_submodule(module_name)
    if is_fp8_linear(module) and leaf == "weight":
        return module.weight_codes
    if is_fp8_linear(module) and leaf == SCALE_SUFFIX[1:]:
        return module.weight_scale
    return getattr(module, leaf)


def weight_tensors(model: nn.Module) -> list[Tensor]:
    """Every live tensor a weight update overwrites in an inference ``model`` (``engine_slots``)."""
    return [engine_tensor(model, name) for name in engine_slots(model)]
