"""Build and validate WeightUpdates — all or nothing (applied by ``receiver.WeightReceiver``).

The trainer quantizes each FP8 linear once per optimizer step; ``build_update`` ships exactly
those codes + 128×128 scales (plus dense tensors in the engine's compute dtype) with a manifest.
The receiver checks the *whole* update before writing a single byte (DESIGN.md §4): names
(missing/extra), roles, shapes, dtypes, block size, scale format, scale values, checksums, quant
fingerprint and version. Any problem raises ``WeightUpdateRefused`` naming each tensor and reason;
the engine keeps its previous weights and version.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor, nn

from fp8rl.protocol import TensorEntry, WeightUpdate
from fp8rl.workers.model.linear import LayerPrecision
from fp8rl.workers.weight_sync.checksum import wsum64
from fp8rl.workers.weight_sync.layout import (
    KV_SCALES,
    SCALE_SUFFIX,
    SlotSpec,
    fp8_shapes,
    is_fp8_linear,
)

_DTYPE_NAMES = {
    str(d).removeprefix("torch."): d
    for d in (torch.float8_e4m3fn, torch.float32, torch.bfloat16, torch.float16)
}


class WeightUpdateRefused(ValueError):
    """A weight update that was not applied; ``problems`` has one line per tensor/reason."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = problems
        shown = "\n".join(f"  {p}" for p in problems[:20])
        more = f"\n  … and {len(problems) - 20} more" if len(problems) > 20 else ""
        super().__init__(
            f"weight update refused ({len(problems)} problems); weights unchanged:\n{shown}{more}"
        )


def dtype_name(dtype: torch.dtype) -> str:
    """``torch.float8_e4m3fn`` → ``float8_e4m3fn``."""
    return str(dtype).removeprefix("torch.")


def build_update(
    model: nn.Module,
    *,
    receiver: LayerPrecision,
    version: int,
    fingerprint: str | None,
    transport: str = "object_store",
    gather: Callable[[Tensor], Tensor | None] | None = None,
) -> tuple[WeightUpdate | None, dict[str, Tensor]]:
    """Manifest + payload of the trainer's current weights in the receiver's layout.

    FP8 linears ship their cached ``quantized_weight()`` (the codes the trainer's own forward
    uses). A linear the trainer runs dense but the receiver runs FP8 (``fp8_rollout`` mode) is
    quantized here, once, from the master weight. Dense tensors are cast to the receiver's dtype.

    Args:
        model: the trainer's Decoder. receiver: the engines' precision (layout and dtype).
        version: policy version (optimizer steps taken). fingerprint: QuantConfig fingerprint.
        transport: recorded in the manifest.
        gather: for a sharded trainer, the full tensor of a parameter (a collective every rank
            calls in the same order; None on ranks that do not send). FP8 weights are then
            quantized here from the gathered master weight — the same ``per_block_quant`` an
            unsharded trainer's cache runs, so the codes and scales are bitwise equal whatever
            the shard boundaries (gather first, quantize once). A rank whose ``gather``
            returns None gets ``(None, {})``.
    """
    from fp8rl.kernels import per_block_quant

    num_blocks = model.config.num_hidden_layers
    payload: dict[str, Tensor] = {}
    meta: dict[str, tuple[str, list[int] | None]] = {}
    fp8_prefixes = set()
    with torch.no_grad():
        for prefix, module in model.named_modules():
            weight = getattr(module, "weight", None)
            is_linear = is_fp8_linear(module) or (
                weight is not None and weight.dim() == 2 and prefix != "model.embed_tokens"
            )
            if not (is_linear and receiver.fp8 and receiver.linear_is_fp8(prefix, num_blocks)):
                continue
            if gather is not None:
                weight = gather(weight)
                if weight is None:  # a rank that does not send: gathered its share, done
                    fp8_prefixes.add(prefix)
                    continue
                q = per_block_quant(
                    weight.detach(),
                    scale_format=receiver.quant.scale_format,
                    name="FP8Linear.weight",
                )
            elif is_fp8_linear(module):
                q = module.quantized_weight()
            else:
                q = per_block_quant(
                    weight.detach(),
                    scale_format=receiver.quant.scale_format,
                    name=f"{prefix}.weight",
                )
            payload[f"{prefix}.weight"] = q.codes
            payload[f"{prefix}{SCALE_SUFFIX}"] = q.scale
            meta[f"{prefix}.weight"] = ("fp8_weight", [128, 128])
            meta[f"{prefix}{SCALE_SUFFIX}"] = ("weight_scale", [128, 128])
            fp8_prefixes.add(prefix)
        for name, param in model.named_parameters():
            owner, _, leaf = name.rpartition(".")
            if owner in fp8_prefixes and leaf == "weight":
                continue
            full = param if gather is None else gather(param)
            if full is None:
                continue
            payload[name] = full.detach().to(receiver.dtype)
            meta[name] = ("dense", None)
        if receiver.kv_fp8:
            for prefix, module in model.named_modules():
                if getattr(module, "kv_fp8", False):
                    for leaf in KV_SCALES:
                        payload[f"{prefix}.{leaf}"] = getattr(module, leaf).detach().clone()
                        meta[f"{prefix}.{leaf}"] = ("kv_scale", None)
    if gather is not None and not payload:  # a rank that only took part in the gathers
        return None, payload
    scale_format = receiver.quant.scale_format if receiver.fp8 else None
    entries = [
        TensorEntry(
            name=name,
            role=role,
            shape=list(t.shape),
            dtype=dtype_name(t.dtype),
            block_size=block,
            scale_format=scale_format if block else None,
            checksum=wsum64(t),
        )
        for name, t in payload.items()
        for role, block in [meta[name]]
    ]
    update = WeightUpdate(
        version=version,
        quant_fingerprint=fingerprint if receiver.fp8 else None,
        transport=transport,
        tensors=entries,
    )
    return update, payload


def validate_update(
    update: WeightUpdate,
    payload: dict[str, Tensor],
    *,
    slots: dict[str, SlotSpec],
    current_version: int | None,
    fingerprint: str | None,
    scale_format: str | None,
) -> list[str]:
    """Every reason to refuse ``update`` (empty list = acceptable). Pure; writes nothing."""
    problems: list[str] = []
    if current_version is not None and update.version <= current_version:
        problems.append(
            f"version {update.version} is not newer than the engine's {current_version}"
        )
    if update.quant_fingerprint != fingerprint:
        problems.append(f"quant fingerprint {update.quant_fingerprint} != engine's {fingerprint}")
    entries = {e.name: e for e in update.tensors}
    for name in sorted(set(slots) - set(entries)):
        problems.append(f"{name}: missing from the update")
    for name in sorted(set(entries) - set(slots)):
        problems.append(f"{name}: not a tensor of this model")
    for name in sorted(set(entries) - set(payload)):
        problems.append(f"{name}: listed in the manifest but absent from the payload")
    for name in sorted(set(payload) - set(entries)):
        problems.append(f"{name}: in the payload but not in the manifest")
    for name in sorted(set(entries) & set(slots) & set(payload)):
        problems += _check_tensor(entries[name], payload[name], slots[name], scale_format)
    return problems


def _check_tensor(
    entry: TensorEntry, tensor: Tensor, slot: SlotSpec, scale_format: str | None
) -> list[str]:
    n, problems = entry.name, []
    if entry.role != slot.role:
        problems.append(f"{n}: role {entry.role} but the engine holds a {slot.role}")
    if tuple(entry.shape) != slot.shape:
        problems.append(f"{n}: shape {tuple(entry.shape)} but the engine needs {slot.shape}")
    if entry.dtype != dtype_name(slot.dtype):
        problems.append(f"{n}: dtype {entry.dtype} but the engine needs {dtype_name(slot.dtype)}")
    if tuple(tensor.shape) != tuple(entry.shape) or dtype_name(tensor.dtype) != entry.dtype:
        problems.append(
            f"{n}: payload is {tuple(tensor.shape)} {dtype_name(tensor.dtype)}, "
            f"manifest says {tuple(entry.shape)} {entry.dtype}"
        )
        return problems
    if slot.role in ("fp8_weight", "weight_scale"):
        if entry.block_size != [128, 128]:
            problems.append(f"{n}: block size {entry.block_size}, the engine uses [128, 128]")
        if entry.scale_format != scale_format:
            problems.append(
                f"{n}: scale format {entry.scale_format}, the engine uses {scale_format}"
            )
    if slot.role in ("weight_scale", "kv_scale") and not problems:
        bad = ~torch.isfinite(tensor) | (tensor <= 0)
        if bool(bad.any()):
            problems.append(f"{n}: {int(bad.sum())} scales are zero, negative or not finite")
    if not problems and wsum64(tensor) != entry.checksum:
        problems.append(f"{n}: checksum mismatch (payload corrupted or from another update)")
    return problems


__all__ = ["WeightUpdateRefused", "build_update", "fp8_shapes", "validate_update"]
