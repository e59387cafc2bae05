"""Hugging Face block-FP8 checkpoints: read, dequantize, load codes exactly, and write.

The layout (DeepSeek-V3, Qwen3-FP8, transformers' ``FineGrainedFP8Config``, what vLLM and SGLang
load with ``quant_method: fp8``): each quantized linear stores ``<module>.weight`` as
``float8_e4m3fn [N, K]`` and ``<module>.weight_scale_inv`` as float32
``[ceil(N/bn), ceil(K/bk)]`` — despite the name, the *dequantization multiplier* of each
``bn×bk`` block (``w ≈ codes * scale``), which is exactly ``QuantizedTensor.scale``. The config
carries ``quantization_config: {quant_method: fp8, fmt: e4m3, weight_block_size: [bn, bk],
activation_scheme: dynamic, modules_to_not_convert: [...]}``; everything else (embeddings,
norms, BF16-kept linears) is a plain BF16 tensor.

Two ways in, one way out:

* ``dequantize_if_block_fp8`` (the hook in ``loading.load_hf_dir``) turns such a checkpoint into
  a float32 state dict, so every role (trainer master weights, BF16 engines) loads it like any
  HF directory. Re-quantizing that copy gives the same codes, but a float32 scale may differ in
  its last bit, so it is not the way to serve the exact policy.
* ``build_block_fp8_decoder`` builds an FP8 inference decoder and copies the checkpoint's codes
  and scales into its FP8 linears unchanged: the logits are bitwise those of the policy that
  wrote the checkpoint (``fp8rl export --format hf-fp8`` writes the trainer's own codes).
* ``quantize_block_fp8`` writes the layout from master weights with ``per_block_quant`` — the
  quantizer the trainer's FP8Linear and the weight sync use, so the exported codes are the
  rollout engine's codes bit for bit.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import torch
from torch import Tensor

from fp8rl.kernels import FP8_DTYPE, GROUP, QuantizedTensor, per_block_quant
from fp8rl.protocol import QuantConfig

log = logging.getLogger(__name__)

SCALE_SUFFIX = ".weight_scale_inv"
"""Name suffix of the block scales (HF / DeepSeek naming, same as fp8rl's weight updates)."""


PARTIAL_BLOCKS_FILE = "fp8rl/partial_blocks.safetensors"
"""Exact codes + scales of FP8 linears with partial 128-blocks, which an ``hf-fp8`` export
stores in BF16 for HF/vLLM loaders (they need whole blocks); read by ``build_block_fp8_decoder``."""


KV_SCALE_SUFFIXES = (".k_scale", ".v_scale")
"""Per-tensor FP8 KV-cache scales (float32 scalars) of an attention module."""


def is_kv_scale(name: str) -> bool:
    """True for ``<attn>.k_scale`` / ``<attn>.v_scale`` (FP8 KV cache scales, not parameters)."""
    return name.endswith(KV_SCALE_SUFFIXES)


def block_fp8_config(hf_config: dict[str, Any]) -> dict[str, Any] | None:
    """The ``quantization_config`` of a block-FP8 checkpoint's ``config.json`` dict, else None.

    Raises:
        ValueError: ``quant_method: fp8`` with a format, block shape or activation scheme fp8rl
            cannot load (the field and its value are named).
    """
    quant = hf_config.get("quantization_config")
    if not isinstance(quant, dict) or quant.get("quant_method") != "fp8":
        return None
    block = quant.get("weight_block_size")
    if block is None:
        raise ValueError(
            "config.json quantization_config has quant_method=fp8 without weight_block_size: "
            "per-tensor FP8 checkpoints are not supported, only block-wise (e.g. [128, 128])"
        )
    if len(block) != 2 or min(block) < 1:
        raise ValueError(f"quantization_config.weight_block_size={block} must be [rows, cols]")
    fmt = quant.get("fmt", "e4m3")
    if fmt != "e4m3":
        raise ValueError(f"quantization_config.fmt={fmt!r}: only e4m3 FP8 weights are supported")
    if quant.get("activation_scheme", "dynamic") != "dynamic":
        log.warning(
            "quantization_config.activation_scheme=%s: static activation scales are ignored "
            "(fp8rl quantizes activations dynamically, 1x128 per token)",
            quant.get("activation_scheme"),
        )
    return quant


def split_block_fp8(
    state: dict[str, Tensor], *, block: tuple[int, int]
) -> tuple[dict[str, Tensor], dict[str, QuantizedTensor | tuple[Tensor, Tensor]]]:
    """Separate dense tensors from quantized linears ``{module: (codes, scale)}``.

    For 128×128 blocks the values are ``QuantizedTensor``; other block shapes stay
    ``(codes, scale)`` pairs (dequantizable, not loadable as fp8rl codes).

    Raises:
        ValueError: an FP8 weight without its ``weight_scale_inv`` (or the reverse), or a scale
            grid that does not match ``ceil(N/bn) × ceil(K/bk)``; the tensor is named.
    """
    dense, quantized = {}, {}
    scales = {k[: -len(SCALE_SUFFIX)]: v for k, v in state.items() if k.endswith(SCALE_SUFFIX)}
    for name, tensor in state.items():
        if name.endswith(SCALE_SUFFIX):
            continue
        module = name.removesuffix(".weight")
        if tensor.dtype != FP8_DTYPE:
            dense[name] = tensor
            continue
        if not name.endswith(".weight") or module not in scales:
            raise ValueError(f"{name} is float8_e4m3fn but {module}{SCALE_SUFFIX} is missing")
        scale = scales.pop(module).to(torch.float32)
        rows, cols = tensor.shape
        grid = (-(-rows // block[0]), -(-cols // block[1]))
        if tuple(scale.shape) != grid:
            raise ValueError(
                f"{module}{SCALE_SUFFIX} has shape {tuple(scale.shape)}; weight {tuple(tensor.shape)} "
                f"with weight_block_size {list(block)} needs {grid}"
            )
        if tuple(block) == (GROUP, GROUP):
            quantized[module] = QuantizedTensor(tensor, scale.contiguous(), (GROUP, GROUP))
        else:
            quantized[module] = (tensor, scale)
    if scales:
        raise ValueError(f"scales without FP8 weights: {sorted(scales)[:8]}")
    return dense, quantized


def dequantize(
    codes: Tensor, scale: Tensor, *, block: tuple[int, int], dtype: torch.dtype = torch.float32
) -> Tensor:
    """``codes [N, K] * scale`` broadcast over ``block``-shaped tiles, in ``dtype`` (float32 math)."""
    rows, cols = codes.shape
    expanded = scale.to(torch.float32).repeat_interleave(block[0], 0)[:rows]
    expanded = expanded.repeat_interleave(block[1], 1)[:, :cols]
    return (codes.to(torch.float32) * expanded).to(dtype)


def dequantize_if_block_fp8(
    hf_config: dict[str, Any], state: dict[str, Tensor] | None
) -> dict[str, Tensor] | None:
    """``state`` with every block-FP8 linear replaced by its float32 dequantization.

    Unchanged when ``config.json`` has no FP8 ``quantization_config`` (or ``state`` is None).
    This is ``loading.load_hf_dir``'s hook. Raises ``ValueError`` as ``split_block_fp8``.
    """
    quant = block_fp8_config(hf_config)
    if quant is None or state is None:
        return state
    block = tuple(quant["weight_block_size"])
    dense, quantized = split_block_fp8(state, block=block)
    log.info("dequantizing %d block-FP8 linear layers (block %s)", len(quantized), list(block))
    out = {k: v for k, v in dense.items() if not is_kv_scale(k)}  # KV scales: not parameters
    for module, q in _progress(quantized.items(), len(quantized), "dequantizing FP8 weights"):
        codes, scale = (q.codes, q.scale) if isinstance(q, QuantizedTensor) else q
        out[f"{module}.weight"] = dequantize(codes, scale, block=block)
    return out


def build_block_fp8_decoder(
    directory: Any,
    *,
    quant: QuantConfig,
    dtype: torch.dtype = torch.bfloat16,
    exact: bool = False,
    max_positions: int = 2048,
    device: torch.device | str = "cpu",
) -> Any:
    """An FP8 inference ``Decoder`` holding a block-FP8 checkpoint's codes and scales unchanged.

    ``quant``'s BF16-kept modules must match the checkpoint (a layer FP8 in the model must be FP8
    in the checkpoint). Dense tensors load in ``dtype``. Raises ``ValueError`` for a checkpoint
    that is not block-FP8 128×128 or does not match the model.
    """
    import json
    from pathlib import Path

    from safetensors.torch import load_file

    from fp8rl.workers.model.build import build_decoder
    from fp8rl.workers.model.config import config_from_hf
    from fp8rl.workers.model.linear import LayerPrecision

    directory = Path(directory)
    hf_config = json.loads((directory / "config.json").read_text())
    fp8_cfg = block_fp8_config(hf_config)
    if fp8_cfg is None or tuple(fp8_cfg["weight_block_size"]) != (GROUP, GROUP):
        raise ValueError(f"{directory} is not a 128x128 block-FP8 checkpoint")
    raw: dict[str, Tensor] = {}
    for file in sorted(directory.glob("*.safetensors")):
        raw.update(load_file(file))
    if (directory / PARTIAL_BLOCKS_FILE).exists():  # exact codes of the BF16-stored partial ones
        raw.update(load_file(directory / PARTIAL_BLOCKS_FILE))
    # Built "trainable" so nothing is quantized here; the FP8 linears are then swapped for
    # inference modules holding the checkpoint's own codes (freeze_fp8 with given codes).
    kv_fp8 = quant.kv_cache_dtype == "fp8_e4m3"
    precision = LayerPrecision(
        dtype=dtype, fp8=True, quant=quant, exact=exact, trainable=True, kv_fp8=kv_fp8
    )
    model = build_decoder(
        config_from_hf(hf_config),
        precision,
        state_dict=dequantize_if_block_fp8(hf_config, raw),  # dense layers + FP8 skeleton
        max_positions=max_positions,
        param_dtype=dtype,
        device=device,
    )
    _, quantized = split_block_fp8(raw, block=(GROUP, GROUP))
    freeze_with_codes(model, quantized)
    if kv_fp8:
        load_kv_scales(model, raw)
    model.precision = replace(precision, trainable=False)
    model.requires_grad_(False)
    return model.eval()


def load_kv_scales(model: torch.nn.Module, state: dict[str, Tensor]) -> int:
    """Copy ``<attn>.k_scale`` / ``v_scale`` from ``state`` into the FP8-KV attention modules.

    Raises ``ValueError`` naming the first attention module whose scales are missing.
    """
    written = 0
    for name, module in model.named_modules():
        if not getattr(module, "kv_fp8", False):
            continue
        for leaf in ("k_scale", "v_scale"):
            if f"{name}.{leaf}" not in state:
                raise ValueError(
                    f"{name}.{leaf} is missing: the checkpoint has no FP8 KV-cache scales "
                    "(export from a run with precision.quant.kv_cache_dtype=fp8_e4m3)"
                )
            with torch.no_grad():
                getattr(module, leaf).copy_(state[f"{name}.{leaf}"].float())
            written += 1
    return written


def freeze_with_codes(model: torch.nn.Module, quantized: dict[str, Any]) -> int:
    """Replace every trainable FP8Linear of ``model`` by an inference FP8Linear holding the
    checkpoint's codes + scales for that module; return the number replaced.

    Raises:
        ValueError: a layer the model runs in FP8 is stored dense in the checkpoint (its codes
            would be re-derived, not the checkpoint's), or its block shape is not 128×128.
    """
    from fp8rl.kernels import FP8Linear

    replaced = 0
    for name, module in list(model.named_modules()):
        if not isinstance(module, FP8Linear) or module.weight is None:
            continue
        q = quantized.get(name)
        if q is None:
            raise ValueError(
                f"{name} runs FP8 in this model but the checkpoint stores it in BF16; use a "
                "QuantConfig whose BF16-kept modules match the checkpoint's modules_to_not_convert"
            )
        if not isinstance(q, QuantizedTensor):
            raise ValueError(f"{name}: only 128x128 blocks load as fp8rl FP8 codes")
        device = module.weight.device
        frozen = FP8Linear.from_quantized(
            QuantizedTensor(q.codes.to(device), q.scale.to(device), q.block),
            None if module.bias is None else module.bias.detach().clone(),
            scale_format=module.scale_format,
            exact=module.exact,
        )
        parent, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent), child, frozen)
        replaced += 1
    return replaced


def quantize_block_fp8(
    weights: dict[str, Tensor],
    *,
    is_fp8: Callable[[str], bool],
    scale_format: str = "fp32",
    dtype: torch.dtype = torch.bfloat16,
) -> dict[str, Tensor]:
    """Master weights (HF names) → the block-FP8 tensor dict (codes, scales, dense in ``dtype``).

    ``is_fp8(module_name)`` selects the linears to quantize (2-D ``<module>.weight`` only);
    each becomes ``per_block_quant(weight)`` codes + ``weight_scale_inv``. Everything else
    (embeddings, norms, biases, BF16-kept linears) is cast to ``dtype``.
    """
    out: dict[str, Tensor] = {}
    names = list(weights)
    for name in _progress(names, len(names), "quantizing to block FP8"):
        tensor = weights[name]
        module = name.removesuffix(".weight")
        if name.endswith(".weight") and tensor.dim() == 2 and is_fp8(module):
            q = per_block_quant(tensor, scale_format=scale_format, name=name)
            out[name] = q.codes.contiguous().cpu()
            out[f"{module}{SCALE_SUFFIX}"] = q.scale.contiguous().cpu()
        else:
            out[name] = tensor.to(dtype).contiguous().cpu()
    return out


def hf_quantization_config(modules_to_not_convert: list[str]) -> dict[str, Any]:
    """The ``quantization_config`` block of an exported block-FP8 ``config.json``."""
    return {
        "quant_method": "fp8",
        "fmt": "e4m3",
        "weight_block_size": [GROUP, GROUP],
        "activation_scheme": "dynamic",
        "modules_to_not_convert": modules_to_not_convert,
    }


def _progress(items: Any, total: int, desc: str, *, every_s: float = 5.0) -> Any:
    """Iterate ``items`` with a tqdm bar on a TTY, else a log line every ``every_s`` seconds."""
    import sys
    import time

    if sys.stderr.isatty():
        from tqdm.auto import tqdm

        yield from tqdm(items, total=total, desc=desc, leave=False)
        return
    last = time.monotonic()
    for done, item in enumerate(items):
        if time.monotonic() - last >= every_s:
            log.info("%s: %d/%d", desc, done, total)
            last = time.monotonic()
        yield item
