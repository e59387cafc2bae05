"""Export a checkpoint as a Hugging Face model directory users can serve or fine-tune.

Formats:

* ``hf-bf16``: the master weights cast to BF16 — the model a BF16 trainer would hand over.
  Loading it in BF16 gives exactly the logits of a BF16 decoder built from the checkpoint.
* ``hf-fp8``: the block-FP8 layout vLLM, SGLang and transformers' FineGrainedFP8 load
  (``quant_method: fp8``, E4M3 ``weight`` + float32 128×128 ``weight_scale_inv``, dynamic
  activations). The codes are ``per_block_quant`` of the master weights — the quantizer the
  trainer's FP8Linear and the weight sync use — so they are the codes the rollout engines ran
  (unified_fp8 / fp8_rollout), bit for bit. Linears the QuantConfig keeps in BF16 (``lm_head``,
  the first/last blocks, ``bf16_modules``) stay BF16 and are listed in
  ``quantization_config.modules_to_not_convert`` (transformers' name; vLLM and SGLang read it
  too). Linears whose shape is not a whole number of 128×128 blocks (SmolLM2's 576-wide ones)
  are listed there too and stored as the BF16 rounding of their dequantized FP8 codes:
  fp8rl's engines quantize partial edge blocks, but transformers' FineGrainedFP8 and vLLM's
  block-FP8 loaders refuse them ("Weight shape (576, 1536) not divisible by scale grid").
  Padding is no way out: the loaders check the weight shape against the model's layer shape.
  vLLM fuses q/k/v and gate/up into one layer whose shards must share a precision, so a
  partial member takes its fused siblings to BF16 with it.
  Their exact codes and scales go to ``fp8rl/partial_blocks.safetensors`` (a subdirectory the
  HF loaders do not read), which ``build_block_fp8_decoder`` loads, so fp8rl still serves
  the run's policy bit for bit. ``pow2`` scales are stored as float32 powers of two (no ``scale_fmt`` key: every loader
  reproduces them exactly). With ``kv_cache_dtype: fp8_e4m3`` the trainer's calibrated per-tensor
  KV scales travel as float32 ``<attn>.k_scale`` / ``<attn>.v_scale`` (vLLM's names); hf-bf16
  drops them.

The directory has ``config.json`` (``DecoderConfig.hf_config()``), the tokenizer and chat
template copied from the checkpoint, ``model.safetensors`` (sharded with an index above
``max_shard_bytes``) and ``fp8rl_export.json`` (provenance: run, step, policy version, quant
fingerprint). It is written to a temporary directory and renamed into place.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import time
from pathlib import Path
from typing import Literal

import torch
from safetensors.torch import save_file
from torch import Tensor

from fp8rl.kernels import GROUP
from fp8rl.protocol import JobSpec, QuantConfig
from fp8rl.services.checkpoint import (
    CHECKPOINTS,
    TOKENIZER_DIR,
    find_checkpoint,
    read_meta,
    read_model_weights,
)
from fp8rl.workers.file_modes import apply_umask
from fp8rl.workers.model.config import DecoderConfig
from fp8rl.workers.model.fp8_checkpoint import (
    PARTIAL_BLOCKS_FILE,
    SCALE_SUFFIX,
    dequantize,
    hf_quantization_config,
    is_kv_scale,
    quantize_block_fp8,
)
from fp8rl.workers.model.linear import LayerPrecision

log = logging.getLogger(__name__)

ExportFormat = Literal["hf-bf16", "hf-fp8"]
FORMATS: tuple[str, ...] = ("hf-bf16", "hf-fp8")
MAX_SHARD_BYTES = 5 * 2**30
"""Shard size of exported safetensors (the Hugging Face ``save_pretrained`` default, 5 GB)."""
EXPORT_MARKER = "fp8rl_export.json"
"""Provenance file of an export; a directory holding it may be replaced by a new export."""


def fp8_linear_names(
    config: DecoderConfig, quant: QuantConfig, weights: dict[str, Tensor]
) -> list[str]:
    """The linear modules of ``weights`` quantized under ``quant``'s BF16-kept rules.

    A linear is a 2-D ``<module>.weight`` other than the token embedding; the rule is the
    engines' (``LayerPrecision.linear_is_fp8``), so the export keeps in BF16 exactly the layers
    the rollout engines kept in BF16.
    """
    precision = LayerPrecision(fp8=True, quant=quant, trainable=False)
    modules = [n.removesuffix(".weight") for n, t in weights.items() if _is_linear(n, t)]
    return [m for m in modules if precision.linear_is_fp8(m, config.num_hidden_layers)]


def whole_blocks(shape: torch.Size | tuple[int, ...]) -> bool:
    """Whether a 2-D weight is a whole number of 128×128 blocks (what HF/vLLM loaders need)."""
    return all(dim % GROUP == 0 for dim in shape)


FUSED_GROUPS = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"))
"""Linears vLLM fuses into one layer (qkv_proj, gate_up_proj): all FP8 or all BF16."""


def with_fused_siblings(modules: set[str], fp8: set[str]) -> set[str]:
    """``modules`` plus the FP8 siblings of any member of a fused group (``FUSED_GROUPS``):
    vLLM refuses a fused layer whose shards differ in precision ("Detected some but not all
    shards of model.layers.0.self_attn.qkv_proj are quantized")."""
    out = set(modules)
    for module in modules:
        parent, _, leaf = module.rpartition(".")
        for group in FUSED_GROUPS:
            if leaf in group:
                out |= {f"{parent}.{g}" for g in group} & fp8
    return out


def export_tensors(
    weights: dict[str, Tensor], *, config: DecoderConfig, fmt: ExportFormat, quant: QuantConfig
) -> tuple[dict[str, Tensor], dict | None, dict[str, Tensor]]:
    """The tensors of an export, its ``quantization_config`` (None for hf-bf16) and the exact
    codes + scales of the FP8 linears with partial 128-blocks (stored BF16 in the main file).

    ``weights``: master weights with HF names (float32 or bfloat16); tied models carry no
    ``lm_head.weight``. Raises ``ValueError`` for an unknown ``fmt``.
    """
    kv_scales = {k: v.float() for k, v in weights.items() if is_kv_scale(k)}
    weights = {k: v for k, v in weights.items() if k not in kv_scales}
    if fmt == "hf-bf16":  # a BF16 model has no FP8 KV cache: its calibrated scales are dropped
        return {k: v.to(torch.bfloat16).contiguous() for k, v in weights.items()}, None, {}
    if fmt != "hf-fp8":
        raise ValueError(f"unknown export format {fmt!r}; choose one of {FORMATS}")
    fp8 = set(fp8_linear_names(config, quant, weights))
    tensors = quantize_block_fp8(weights, is_fp8=fp8.__contains__, scale_format=quant.scale_format)
    partial_codes: dict[str, Tensor] = {}
    partial = with_fused_siblings(
        {m for m in fp8 if not whole_blocks(weights[f"{m}.weight"].shape)}, fp8
    )
    for module in sorted(partial):
        codes, scale = tensors[f"{module}.weight"], tensors.pop(f"{module}{SCALE_SUFFIX}")
        partial_codes |= {f"{module}.weight": codes, f"{module}{SCALE_SUFFIX}": scale}
        tensors[f"{module}.weight"] = dequantize(codes, scale, block=(GROUP, GROUP)).to(
            torch.bfloat16
        )
    tensors.update(kv_scales)  # float32 <attn>.k_scale / v_scale, vLLM's FP8 KV cache names
    kept = sorted(
        {n.removesuffix(".weight") for n, t in weights.items() if _is_linear(n, t)} - fp8
        | partial
        | {"lm_head"}
    )
    return tensors, hf_quantization_config(kept), partial_codes


def export_checkpoint(
    location: Path,
    *,
    fmt: ExportFormat,
    out: Path | None = None,
    step: int | None = None,
    max_shard_bytes: int = MAX_SHARD_BYTES,
) -> Path:
    """Export the checkpoint at ``location`` (run dir, checkpoints dir or one checkpoint).

    Args:
        fmt: ``hf-bf16`` or ``hf-fp8``. step: that step's checkpoint (default: latest).
        out: target directory (default ``<run_dir>/exports/<fmt>-step_<N>``). A previous export
            there (it has ``fp8rl_export.json``) or an empty directory is replaced; anything else
            is refused (``check_export_target``).
    Returns the export directory.
    Raises:
        CheckpointError: no checkpoint there. CheckpointCorruptError: it fails verification.
        ValueError: unknown format; ``out`` is not a place an export may go (nothing written).
    """
    if fmt not in FORMATS:
        raise ValueError(f"unknown export format {fmt!r}; choose one of {FORMATS}")
    start = time.perf_counter()
    checkpoint = find_checkpoint(location, step=step)  # verified: sizes and sha256 of every file
    meta = read_meta(checkpoint)
    job = JobSpec.model_validate(meta.job)
    config = DecoderConfig(**meta.decoder_config)
    if out is None:
        run_dir = checkpoint.parent.parent if checkpoint.parent.name == CHECKPOINTS else checkpoint
        out = run_dir / "exports" / f"{fmt}-step_{meta.step}"
    out = Path(out).expanduser().resolve()
    check_export_target(out, checkpoint)
    log.info("exporting %s as %s to %s", checkpoint, fmt, out)
    tensors, quantization, partial_codes = export_tensors(
        read_model_weights(checkpoint, checksums=False),
        config=config,
        fmt=fmt,
        quant=job.precision.quant,
    )
    if partial_codes:
        log.info(
            "%d FP8 linears are not whole 128-blocks: stored BF16 for HF/vLLM loaders "
            "(modules_to_not_convert), exact codes in %s",
            len(partial_codes) // 2,
            PARTIAL_BLOCKS_FILE,
        )
    tmp = out.parent / f".tmp-{out.name}-{os.getpid()}"
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
    except OSError as error:  # not a checkpoint problem: the target (exit 1)
        raise OSError(f"cannot write the export to {out}: {error.strerror or error}") from None
    try:
        hf_config = {**config.hf_config(), "torch_dtype": "bfloat16"}
        if quantization is not None:
            hf_config["quantization_config"] = quantization
        (tmp / "config.json").write_text(json.dumps(hf_config, indent=2) + "\n")
        tokenizer = checkpoint / TOKENIZER_DIR
        if tokenizer.is_dir():
            for file in tokenizer.iterdir():
                shutil.copyfile(file, tmp / file.name)
        else:
            log.warning("%s has no tokenizer: the export has weights and config only", checkpoint)
        write_safetensors(tensors, tmp, max_shard_bytes=max_shard_bytes)
        if partial_codes:
            (tmp / PARTIAL_BLOCKS_FILE).parent.mkdir()
            save_file(partial_codes, tmp / PARTIAL_BLOCKS_FILE, metadata={"format": "pt"})
        provenance = {
            "format": fmt,
            "checkpoint": str(checkpoint.resolve()),
            "step": meta.step,
            "policy_version": meta.policy_version,
            "quant_fingerprint": meta.quant_fingerprint,
            "precision_mode": meta.precision_mode,
            "model_path": meta.model_path,
        }
        (tmp / EXPORT_MARKER).write_text(json.dumps(provenance, indent=2) + "\n")
        apply_umask(tmp)  # safetensors writes 0600: others (a vLLM service) must read it
        if out.exists():
            shutil.rmtree(out)
        os.replace(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    size = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
    log.info("exported %s (%.1f MB in %.1f s)", out, size / 2**20, time.perf_counter() - start)
    return out


def check_export_target(out: Path, checkpoint: Path) -> None:
    """Refuse an export directory whose replacement would lose data, before any work is done.

    ``out`` (resolved) may be new, an empty directory or a previous export (it holds
    ``fp8rl_export.json``); those are replaced. Refused with ``ValueError``: a file, any other
    non-empty directory (a run directory, the current directory, a user's folder), the checkpoint
    itself, a directory holding it, or a place inside it.
    """
    checkpoint = checkpoint.resolve()
    if out == checkpoint or out in checkpoint.parents or checkpoint in out.parents:
        raise ValueError(
            f"--out {out} would replace or write into the checkpoint {checkpoint}: "
            "choose a directory outside it"
        )
    if not out.exists():
        return
    if not out.is_dir():
        raise ValueError(f"--out {out} exists and is not a directory")
    if any(out.iterdir()) and not (out / EXPORT_MARKER).is_file():
        raise ValueError(
            f"--out {out} is a non-empty directory that is not an fp8rl export (no "
            f"{EXPORT_MARKER}); it would be replaced: choose a new directory or remove it first"
        )


def write_safetensors(
    tensors: dict[str, Tensor], directory: Path, *, max_shard_bytes: int = MAX_SHARD_BYTES
) -> list[str]:
    """``model.safetensors``, or ``model-0000i-of-0000n.safetensors`` + index when larger than
    ``max_shard_bytes`` (Hugging Face's sharding convention). Returns the file names."""
    shards: list[dict[str, Tensor]] = [{}]
    size = 0
    for name in sorted(tensors):
        nbytes = tensors[name].numel() * tensors[name].element_size()
        if shards[-1] and size + nbytes > max_shard_bytes:
            shards.append({})
            size = 0
        shards[-1][name] = tensors[name]
        size += nbytes
    if len(shards) == 1:
        save_file(shards[0], directory / "model.safetensors", metadata={"format": "pt"})
        return ["model.safetensors"]
    files, weight_map = [], {}
    for i, shard in enumerate(shards, start=1):
        file = f"model-{i:05d}-of-{len(shards):05d}.safetensors"
        save_file(shard, directory / file, metadata={"format": "pt"})
        files.append(file)
        weight_map.update(dict.fromkeys(shard, file))
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (directory / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")
    return files


def _is_linear(name: str, tensor: Tensor) -> bool:
    return name.endswith(".weight") and tensor.dim() == 2 and name != "model.embed_tokens.weight"
