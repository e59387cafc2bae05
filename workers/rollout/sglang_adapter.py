"""Pure translations between fp8rl's protocol and SGLang 0.5.23's offline ``Engine`` API.

No SGLang import here: server arguments, the block-FP8 ``config.json`` rules SGLang enforces at
start, sampling parameters, output parsing and weight-update buckets are plain functions, so the
backend's logic is testable on CPU and the methods it calls are checked against SGLang's source
(``tests/sglang_backend/test_sglang_contract.py``).

Sources (sglang 0.5.23 wheel): ``srt/entrypoints/engine.py`` (Engine methods),
``srt/layers/quantization/fp8.py`` (``Fp8Config``, ``validate_block_quant_shapes``),
``srt/layers/quantization/utils.py`` (``is_layer_skipped``: fused shards must agree),
``srt/layers/sampler.py`` (returned logprobs: ``log(softmax(logits / T))``),
``srt/managers/schedule_batch.py`` (finish reasons ``{"type": "stop"|"length"}``).
"""

from __future__ import annotations

from typing import Any

from torch import Tensor

from fp8rl.protocol import SamplingParams, SGLangRollout
from fp8rl.workers.model.config import DecoderConfig
from fp8rl.workers.model.fp8_checkpoint import hf_quantization_config
from fp8rl.workers.model.linear import LayerPrecision
from fp8rl.workers.weight_sync.layout import SlotSpec

FP8_BLOCK = 128
"""SGLang's block-FP8 weight block (``weight_block_size: [128, 128]``; activations are quantized
per token in 1×128 groups)."""

PROBE_LOADER = "fp8rl.workers.rollout.sglang_probe.read_kv_scales"
"""Custom weight loader (``ServerArgs.custom_weight_loader``) that reads KV scales back."""


def fused_shards(config: DecoderConfig) -> dict[str, list[tuple[str, int]]]:
    """SGLang's fused linears of one block → their checkpoint shards and output sizes.

    ``qkv_proj`` = q/k/v, ``gate_up_proj`` = gate/up (``_FALLBACK_FUSED_SHARDS`` in SGLang).
    """
    q = config.num_attention_heads * config.head_dim
    kv = config.num_key_value_heads * config.head_dim
    inter = config.intermediate_size
    return {
        "self_attn.qkv_proj": [("self_attn.q_proj", q), ("self_attn.k_proj", kv), ("self_attn.v_proj", kv)],
        "mlp.gate_up_proj": [("mlp.gate_proj", inter), ("mlp.up_proj", inter)],
    }  # fmt: skip


def block_fp8_problems(config: DecoderConfig, precision: LayerPrecision, tp: int) -> list[str]:
    """Why SGLang would refuse to build this model in block-FP8 mode (empty: it builds).

    SGLang fuses q/k/v and gate/up into one linear: all shards must share one precision, and
    every FP8 shard's output rows (per TP rank) must be a multiple of 128, or the fused 128×128
    scale grid would straddle two shards. With TP > 1 a row-parallel FP8 linear's input
    columns per rank must be a multiple of 128 too.
    """
    if not precision.fp8:
        return []
    problems, blocks = [], config.num_hidden_layers
    for i in range(blocks):
        base = f"model.layers.{i}"
        for fused, shards in fused_shards(config).items():
            fp8 = [precision.linear_is_fp8(f"{base}.{s}", blocks) for s, _ in shards]
            if len(set(fp8)) > 1:
                problems.append(
                    f"{base}.{fused}: SGLang fuses {', '.join(s for s, _ in shards)} but "
                    "precision.quant keeps only some of them in BF16 (list all or none)"
                )
            elif fp8[0]:
                problems += [
                    f"{base}.{s}: {n // tp} output rows per TP rank is not a multiple of "
                    f"{FP8_BLOCK}: SGLang cannot fuse it in block FP8 (keep it in BF16 with "
                    "precision.quant.bf16_modules)"
                    for s, n in shards
                    if (n // tp) % FP8_BLOCK
                ]
        rows = {"self_attn.o_proj": config.num_attention_heads * config.head_dim,
                "mlp.down_proj": config.intermediate_size}  # fmt: skip
        for name, cols in rows.items():
            fp8 = precision.linear_is_fp8(f"{base}.{name}", blocks)
            if tp > 1 and fp8 and (cols // tp) % FP8_BLOCK:
                problems.append(
                    f"{base}.{name}: {cols // tp} input columns per TP rank is not a "
                    f"multiple of {FP8_BLOCK}"
                )
    return problems


def dense_linears(slots: dict[str, SlotSpec]) -> list[str]:
    """Linear modules an engine keeps dense (2-D ``dense`` weights other than embeddings)."""
    return sorted(
        name.removesuffix(".weight")
        for name, s in slots.items()
        if s.role == "dense" and len(s.shape) == 2 and "embed_tokens" not in name
    )


def engine_config(
    config: DecoderConfig, precision: LayerPrecision, slots: dict[str, SlotSpec]
) -> dict[str, Any]:
    """``config.json`` of the directory SGLang starts from: the architecture and, in FP8, the
    ``quantization_config`` of an fp8rl ``hf-fp8`` export (``quant_method: fp8``, E4M3,
    ``weight_block_size: [128, 128]``, dynamic activations, dense linears listed)."""
    out = config.hf_config()
    if precision.fp8:
        out["quantization_config"] = hf_quantization_config(dense_linears(slots))
    return out


def server_args(
    spec: SGLangRollout,
    *,
    model_dir: str,
    dtype: str,
    max_model_len: int,
    kv_fp8: bool,
    fp8: bool,
    seed: int,
) -> dict[str, Any]:
    """Keyword arguments of ``sglang.Engine(**kwargs)`` (``ServerArgs`` fields).

    The engine starts on dummy weights (``load_format: dummy``) and receives version 0 through
    the weight-update path, as every later version. ``custom_weight_loader`` registers the
    KV-scale read-back; tokenization stays in fp8rl (``skip_tokenizer_init``).
    """
    return {
        "model_path": model_dir,
        "load_format": "dummy",
        "dtype": dtype,
        "context_length": max_model_len,
        "quantization": "fp8" if fp8 else None,
        "kv_cache_dtype": "fp8_e4m3" if kv_fp8 else "auto",
        "tp_size": spec.tensor_parallel_size,
        "mem_fraction_static": spec.mem_fraction_static,
        "enable_memory_saver": spec.enable_memory_saver,
        "skip_tokenizer_init": True,
        "random_seed": seed,
        "custom_weight_loader": [PROBE_LOADER],
        "log_level": "error",
    }


def refuse_filters(top_k: int, top_p: float) -> None:
    """Raise ValueError for top-k/top-p: SGLang would report logprobs of the filtered
    distribution, not the full softmax of logits/T the trainer scores."""
    if top_k > 0 or top_p < 1.0:
        raise ValueError(
            f"rollout.top_k={top_k} / rollout.top_p={top_p}: the SGLang backend cannot report "
            "the full-vocabulary logprob of a filtered sample; set top_k: 0 and top_p: 1.0, "
            "or use rollout.backend: native"
        )


def sampling_params(sp: SamplingParams, stop: list[int], *, index: int) -> dict[str, Any]:
    """SGLang ``sampling_params`` of one sample (``n: 1``; fp8rl expands the n samples).

    ``index`` = prompt_index × n + sample_index, so sample j of prompt i is seeded with
    ``seed + i·n + j`` (the vLLM backend's rule). Temperature 0 is greedy.
    """
    out: dict[str, Any] = {
        "max_new_tokens": sp.max_tokens,
        "temperature": sp.temperature,
        "stop_token_ids": stop,
        "n": 1,
    }
    if sp.seed is not None:
        out["sampling_seed"] = sp.seed + index
    return out


def parse_output(out: dict[str, Any]) -> tuple[list[int], list[float], str]:
    """(token ids, per-token logprobs in nats, ``stop``|``length``) of one ``Engine.generate``
    result (``output_ids``; ``meta_info.output_token_logprobs`` = ``(logprob, token_id, text)``).

    Raises:
        RuntimeError: the request was aborted, or logprobs do not match the tokens.
    """
    tokens = list(out["output_ids"])
    meta = out["meta_info"]
    reason = (meta.get("finish_reason") or {}).get("type")
    if reason not in ("stop", "length"):
        raise RuntimeError(f"SGLang finished a request with {meta.get('finish_reason')!r}")
    pairs = meta["output_token_logprobs"]
    if [int(p[1]) for p in pairs] != tokens:
        raise RuntimeError("SGLang returned logprobs for other tokens than it sampled")
    return tokens, [float(p[0]) for p in pairs], reason


def buckets(named: list[tuple[str, Tensor]], max_bytes: int) -> list[list[tuple[str, Tensor]]]:
    """Consecutive groups of ``named`` of at most ``max_bytes`` each (a larger tensor alone)."""
    out: list[list[tuple[str, Tensor]]] = [[]]
    size = 0
    for name, t in named:
        nbytes = t.numel() * t.element_size()
        if out[-1] and size + nbytes > max_bytes:
            out.append([])
            size = 0
        out[-1].append((name, t))
        size += nbytes
    return [b for b in out if b]


def kv_scale_params(slots: dict[str, SlotSpec]) -> dict[str, str]:
    """fp8rl KV-scale slot → SGLang parameter (``…self_attn.k_scale`` → ``…self_attn.attn.k_scale``,
    ``maybe_remap_kv_scale_name``)."""
    return {
        name: name.replace(".k_scale", ".attn.k_scale").replace(".v_scale", ".attn.v_scale")
        for name, s in slots.items()
        if s.role == "kv_scale"
    }


__all__ = [
    "FP8_BLOCK",
    "PROBE_LOADER",
    "block_fp8_problems",
    "buckets",
    "engine_config",
    "kv_scale_params",
    "parse_output",
    "refuse_filters",
    "sampling_params",
    "server_args",
]
