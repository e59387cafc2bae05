"""Publish the Megatron trainer's weights as the native trainer's WeightUpdate (HF names).

Each (PP stage, TP rank) takes the codes + 128×128 scales its FP8 linears already use in their
forward (one quantization per native part, ``linears._PlannedLinear``), renames the parts to HF
modules and gathers them over TP: shards are whole 128×128 blocks of the native tensor
(``layout.model_fit_problems`` refuses other splits for FP8), so concatenating codes and scale
grids gives exactly the native trainer's quantization of the same master weights. Dense tensors
are gathered as float32 masters and cast to the receiver's dtype. Linears the trainer runs dense
but the receiver runs FP8 (``fp8_rollout``) are quantized once after the gather, as
``weight_sync.update.build_update`` does. Pipeline stages exchange their pieces with
``all_gather_object`` (CPU tensors).

The manifest has the same names, roles, shapes, dtypes, block sizes, scale formats and
checksums as ``build_update`` on the native decoder.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from megatron.core import parallel_state
from torch import Tensor

from fp8rl.kernels import per_block_quant
from fp8rl.protocol import TensorEntry, WeightUpdate
from fp8rl.workers.model.linear import LayerPrecision
from fp8rl.workers.trainer.megatron.convert import megatron_to_hf, unshard
from fp8rl.workers.trainer.megatron.spec import FUSED
from fp8rl.workers.weight_sync.checksum import wsum64
from fp8rl.workers.weight_sync.layout import SCALE_SUFFIX

_ROW_PARALLEL = ("linear_proj", "linear_fc2")


def _tp_gather(tensor: Tensor) -> list[Tensor]:
    """Every TP rank's ``tensor`` (same shape on all ranks), in rank order."""
    if parallel_state.get_tensor_model_parallel_world_size() == 1:
        return [tensor]
    group = parallel_state.get_tensor_model_parallel_group()
    wire = tensor.contiguous()
    if wire.dtype == torch.float8_e4m3fn:  # gloo has no FP8 type: move bytes
        wire = wire.view(torch.uint8)
    pieces = [torch.empty_like(wire) for _ in range(dist.get_world_size(group))]
    dist.all_gather(pieces, wire, group=group)
    return [p.view(tensor.dtype) for p in pieces]


def _hf_modules(local_name: str, first_layer: int) -> tuple[str, tuple[str, ...]] | None:
    """``decoder.layers.3.mlp.linear_fc1`` → (``linear_fc1``, HF module names with global index)."""
    parts = local_name.split(".")
    if local_name == "output_layer":
        return "output_layer", ("lm_head",)
    if len(parts) < 5 or parts[:2] != ["decoder", "layers"] or parts[-1] not in FUSED:
        return None
    layer = int(parts[2]) + first_layer
    return parts[-1], tuple(f"model.layers.{layer}.{m}" for m in FUSED[parts[-1]])


def _fp8_pieces(model) -> dict[str, Tensor]:
    """HF-named FP8 codes and scales of this stage's FP8 linears, gathered over TP."""
    out: dict[str, Tensor] = {}
    vocab = model.fp8rl_config.vocab_size
    for local_name, module in model.named_modules():
        plan = getattr(module, "plan", None)
        found = _hf_modules(local_name, model.fp8rl_layers.start)
        if plan is None or not plan.fp8 or found is None:
            continue
        kind, hf_modules = found
        weight = module.weight
        dim = 1 if kind in _ROW_PARALLEL else 0
        for hf, q in zip(hf_modules, module._quantized_parts(weight), strict=True):
            codes = torch.cat(_tp_gather(q.codes), dim=dim)
            scale = torch.cat(_tp_gather(q.scale), dim=dim)
            if kind == "output_layer":  # drop zero vocabulary padding (whole padded blocks too)
                codes, scale = codes[:vocab], scale[: -(-vocab // 128)]
            out[f"{hf}.weight"], out[f"{hf}{SCALE_SUFFIX}"] = codes, scale
    return out


def _dense_masters(model) -> dict[str, Tensor]:
    """This stage's float32 masters, unsharded over TP, Megatron names with global layers."""
    from fp8rl.workers.trainer.megatron.model import _global_name

    out = {}
    for name, param in model.named_parameters():
        out[_global_name(name, model)] = unshard(name, _tp_gather(param.detach()))
    if not model.pre_process and model.post_process and model.share_embeddings_and_output_weights:
        out["embedding.word_embeddings.weight"] = out.pop("output_layer.weight")
    return out


def _all_stages(local: dict[str, Tensor]) -> dict[str, Tensor]:
    """Merge every pipeline stage's entries (``all_gather_object``; FP8 travels as bytes)."""
    pp = parallel_state.get_pipeline_model_parallel_world_size()
    if pp == 1:
        return local
    wire = {
        k: (v.cpu().view(torch.uint8), True) if v.dtype == torch.float8_e4m3fn else (v.cpu(), False)
        for k, v in local.items()
    }
    gathered: list[dict | None] = [None] * pp
    dist.all_gather_object(gathered, wire, group=parallel_state.get_pipeline_model_parallel_group())
    merged: dict[str, Tensor] = {}
    for piece in gathered:
        for k, (v, fp8) in piece.items():
            merged[k] = v.view(torch.float8_e4m3fn) if fp8 else v
    return merged


def megatron_update(
    model,
    *,
    receiver: LayerPrecision,
    version: int,
    fingerprint: str | None,
    transport: str = "object_store",
) -> tuple[WeightUpdate, dict[str, Tensor]]:
    """Manifest + payload of the whole model (every rank returns the same), HF names.

    Collective over the TP and PP groups. Args as ``weight_sync.update.build_update``.
    """
    config = model.fp8rl_config
    with torch.no_grad():
        fp8 = _all_stages(_fp8_pieces(model)) if receiver.fp8 else {}
        masters = _all_stages(_dense_masters(model))
    hf = megatron_to_hf(masters, config)
    n = config.num_hidden_layers
    payload: dict[str, Tensor] = {}
    meta: dict[str, tuple[str, list[int] | None]] = {}
    for name, tensor in hf.items():
        module, _, leaf = name.rpartition(".")
        linear = leaf == "weight" and tensor.dim() == 2 and module != "model.embed_tokens"
        if linear and receiver.fp8 and receiver.linear_is_fp8(module, n):
            if name not in fp8:  # trainer dense, receiver FP8: quantize once here
                q = per_block_quant(tensor, scale_format=receiver.quant.scale_format, name=name)
                fp8[name], fp8[f"{module}{SCALE_SUFFIX}"] = q.codes, q.scale
            payload[name], payload[f"{module}{SCALE_SUFFIX}"] = (
                fp8[name],
                fp8[f"{module}{SCALE_SUFFIX}"],
            )
            meta[name] = ("fp8_weight", [128, 128])
            meta[f"{module}{SCALE_SUFFIX}"] = ("weight_scale", [128, 128])
            continue
        payload[name] = tensor.to(receiver.dtype)
        meta[name] = ("dense", None)
    scale_format = receiver.quant.scale_format if receiver.fp8 else None
    entries = [
        TensorEntry(
            name=name,
            role=role,
            shape=list(t.shape),
            dtype=str(t.dtype).removeprefix("torch."),
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
