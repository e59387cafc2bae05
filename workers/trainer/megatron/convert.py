"""Hugging Face ↔ Megatron-core GPTModel weights (Llama / Mistral / Qwen2 / Qwen3 families).

Every function is a pure re-arrangement of tensors (slices, concatenations, copies), so
HF → Megatron → HF is bitwise. Megatron names use *global* layer indices here; ``stage_view``
renames them to a pipeline stage's local indices.

Layouts (``np`` query heads, ``ng`` KV groups, ``hn`` head dim, ``I`` intermediate size):
    linear_qkv.weight  [ng·(np/ng + 2)·hn, H]: per group g, ``[q heads of g; k_g; v_g]``
                       (``linear_qkv.bias`` the same way, Qwen2 q/k/v biases).
    linear_fc1.weight  [2·I, H] = ``[gate; up]`` at TP 1; a TP rank holds
                       ``[gate shard; up shard]``, which ``shard``/``unshard`` handle.
    word_embeddings / output_layer  [V_pad, H]: rows ≥ V are zero padding (dropped on export).
"""

from __future__ import annotations

import torch
from torch import Tensor

from fp8rl.workers.model.config import DecoderConfig

_LAYER = "decoder.layers.{i}."
_HF_LAYER = "model.layers.{i}."
_RENAMES = {  # one-to-one per layer: megatron suffix → HF suffix
    "input_layernorm.weight": "input_layernorm.weight",
    "pre_mlp_layernorm.weight": "post_attention_layernorm.weight",
    "self_attention.linear_proj.weight": "self_attn.o_proj.weight",
    "self_attention.q_layernorm.weight": "self_attn.q_norm.weight",
    "self_attention.k_layernorm.weight": "self_attn.k_norm.weight",
    "mlp.linear_fc2.weight": "mlp.down_proj.weight",
}
COLUMN = ("linear_qkv.weight", "linear_qkv.bias", "linear_fc1.weight")
"""Megatron suffixes split along rows across TP ranks (besides the vocabulary tables)."""
ROW = ("linear_proj.weight", "linear_fc2.weight")
"""Megatron suffixes split along columns across TP ranks."""
VOCAB = ("embedding.word_embeddings.weight", "output_layer.weight")
"""Vocabulary tables, split along rows across TP ranks."""


def _qkv_interleave(q: Tensor, k: Tensor, v: Tensor, config: DecoderConfig) -> Tensor:
    """``[np·hn, ...], [ng·hn, ...], [ng·hn, ...]`` → fused ``[ng·(np/ng+2)·hn, ...]``."""
    ng, hn = config.num_key_value_heads, config.head_dim
    per = config.num_attention_heads // ng
    rest = q.shape[1:]
    q = q.reshape(ng, per * hn, *rest)
    k, v = k.reshape(ng, hn, *rest), v.reshape(ng, hn, *rest)
    return torch.cat([q, k, v], dim=1).reshape(-1, *rest)


def qkv_split(fused: Tensor, config: DecoderConfig) -> tuple[Tensor, Tensor, Tensor]:
    """Inverse of the interleave: fused (or a TP shard with ``num_key_value_heads`` scaled down by
    the caller's config) → ``q, k, v`` in HF layout."""
    ng, hn = config.num_key_value_heads, config.head_dim
    per = config.num_attention_heads // ng
    rest = fused.shape[1:]
    grouped = fused.reshape(ng, (per + 2) * hn, *rest)
    q, k, v = grouped.split([per * hn, hn, hn], dim=1)
    return q.reshape(-1, *rest), k.reshape(-1, *rest), v.reshape(-1, *rest)


def qkv_native_order(config: DecoderConfig, tp: int) -> Tensor:
    """Row index ``idx`` [rows/tp] int64 with ``shard[idx] = cat(q_shard, k_shard, v_shard)`` for a
    TP rank's fused QKV shard (the same for every rank)."""
    local = DecoderConfig(
        **{
            **config.__dict__,
            "num_attention_heads": config.num_attention_heads // tp,
            "num_key_value_heads": config.num_key_value_heads // tp,
        }
    )
    rows = (
        local.num_attention_heads * local.head_dim + 2 * local.num_key_value_heads * local.head_dim
    )
    q, k, v = qkv_split(torch.arange(rows), local)
    return torch.cat([q, k, v])


def _pad_rows(weight: Tensor, rows: int) -> Tensor:
    if rows == weight.shape[0]:
        return weight.clone()
    out = weight.new_zeros((rows, *weight.shape[1:]))
    out[: weight.shape[0]] = weight
    return out


def hf_to_megatron(
    hf: dict[str, Tensor], config: DecoderConfig, *, vocab_padded: int
) -> dict[str, Tensor]:
    """HF-named state dict → Megatron GPTModel names (global layer indices, unsharded).

    Raises:
        ValueError: missing or unexpected HF names (listed), or ``vocab_padded < vocab_size``.
    """
    if vocab_padded < config.vocab_size:
        raise ValueError(f"vocab_padded {vocab_padded} < vocab_size {config.vocab_size}")
    expected = set(hf_names(config))
    given = set(hf) - ({"lm_head.weight"} if config.tie_word_embeddings else set())
    if given != expected:
        raise ValueError(
            f"HF state dict does not match the config: missing {sorted(expected - given)[:8]}, "
            f"unexpected {sorted(given - expected)[:8]}"
        )
    out = {
        "embedding.word_embeddings.weight": _pad_rows(
            hf["model.embed_tokens.weight"], vocab_padded
        ),
        "decoder.final_layernorm.weight": hf["model.norm.weight"].clone(),
    }
    if not config.tie_word_embeddings:
        out["output_layer.weight"] = _pad_rows(hf["lm_head.weight"], vocab_padded)
    for i in range(config.num_hidden_layers):
        mg, h = _LAYER.format(i=i), _HF_LAYER.format(i=i)
        for m_suffix, h_suffix in _RENAMES.items():
            if h + h_suffix in hf:
                out[mg + m_suffix] = hf[h + h_suffix].clone()
        attn = h + "self_attn."
        for kind in ("weight", "bias") if config.attention_bias else ("weight",):
            out[f"{mg}self_attention.linear_qkv.{kind}"] = _qkv_interleave(
                hf[f"{attn}q_proj.{kind}"],
                hf[f"{attn}k_proj.{kind}"],
                hf[f"{attn}v_proj.{kind}"],
                config,
            )
        out[mg + "mlp.linear_fc1.weight"] = torch.cat(
            [hf[h + "mlp.gate_proj.weight"], hf[h + "mlp.up_proj.weight"]]
        )
    return out


def megatron_to_hf(mg: dict[str, Tensor], config: DecoderConfig) -> dict[str, Tensor]:
    """Inverse of ``hf_to_megatron`` (vocab padding dropped; no ``lm_head`` when tied)."""
    v = config.vocab_size
    out = {
        "model.embed_tokens.weight": mg["embedding.word_embeddings.weight"][:v].clone(),
        "model.norm.weight": mg["decoder.final_layernorm.weight"].clone(),
    }
    if not config.tie_word_embeddings:
        out["lm_head.weight"] = mg["output_layer.weight"][:v].clone()
    for i in range(config.num_hidden_layers):
        m, h = _LAYER.format(i=i), _HF_LAYER.format(i=i)
        for m_suffix, h_suffix in _RENAMES.items():
            if m + m_suffix in mg:
                out[h + h_suffix] = mg[m + m_suffix].clone()
        for kind in ("weight", "bias") if config.attention_bias else ("weight",):
            q, k, vv = qkv_split(mg[f"{m}self_attention.linear_qkv.{kind}"], config)
            out[f"{h}self_attn.q_proj.{kind}"] = q.clone()
            out[f"{h}self_attn.k_proj.{kind}"] = k.clone()
            out[f"{h}self_attn.v_proj.{kind}"] = vv.clone()
        gate, up = mg[m + "mlp.linear_fc1.weight"].chunk(2)
        out[h + "mlp.gate_proj.weight"], out[h + "mlp.up_proj.weight"] = gate.clone(), up.clone()
    return out


def hf_names(config: DecoderConfig) -> list[str]:
    """The HF parameter names of ``config`` (``lm_head.weight`` only when untied)."""
    names = ["model.embed_tokens.weight", "model.norm.weight"]
    if not config.tie_word_embeddings:
        names.append("lm_head.weight")
    for i in range(config.num_hidden_layers):
        h = _HF_LAYER.format(i=i)
        names += [h + "input_layernorm.weight", h + "post_attention_layernorm.weight"]
        names += [f"{h}self_attn.{p}_proj.weight" for p in "qkvo"]
        if config.attention_bias:
            names += [f"{h}self_attn.{p}_proj.bias" for p in "qkv"]
        if config.qk_norm:
            names += [h + "self_attn.q_norm.weight", h + "self_attn.k_norm.weight"]
        names += [f"{h}mlp.{p}_proj.weight" for p in ("gate", "up", "down")]
    return names


def shard(name: str, full: Tensor, *, tp: int, tp_rank: int) -> Tensor:
    """TP rank ``tp_rank``'s piece of unsharded Megatron tensor ``name`` (replicated → a copy)."""
    if tp == 1:
        return full.clone()
    if name.endswith("linear_fc1.weight"):
        gate, up = full.chunk(2)
        return torch.cat([gate.chunk(tp)[tp_rank], up.chunk(tp)[tp_rank]])
    if name.endswith(COLUMN) or name in VOCAB:
        return full.chunk(tp)[tp_rank].clone()
    if name.endswith(ROW):
        return full.chunk(tp, dim=1)[tp_rank].clone()
    return full.clone()


def unshard(name: str, pieces: list[Tensor]) -> Tensor:
    """Inverse of ``shard``: the unsharded tensor from every TP rank's piece (rank order)."""
    if len(pieces) == 1:
        return pieces[0].clone()
    if name.endswith("linear_fc1.weight"):
        halves = [p.chunk(2) for p in pieces]
        return torch.cat([h[0] for h in halves] + [h[1] for h in halves])
    if name.endswith(COLUMN) or name in VOCAB:
        return torch.cat(pieces)
    if name.endswith(ROW):
        return torch.cat(pieces, dim=1)
    return pieces[0].clone()


def stage_view(
    mg: dict[str, Tensor], layers: range, *, first: bool, last: bool
) -> dict[str, Tensor]:
    """The entries a pipeline stage holds, decoder layers renamed to stage-local indices.

    ``first`` keeps the embedding, ``last`` the final norm and output layer. With tied
    embeddings a last stage that is not also the first holds its own ``output_layer.weight``, a
    copy of the embedding (as Megatron allocates it there).
    """
    out = {}
    for name, tensor in mg.items():
        if name.startswith("decoder.layers."):
            index = int(name.split(".")[2])
            if index in layers:
                rest = name.split(".", 3)[3]
                out[f"decoder.layers.{index - layers.start}.{rest}"] = tensor
        elif name.startswith("embedding."):
            if first:
                out[name] = tensor
            elif last and "output_layer.weight" not in mg:
                out["output_layer.weight"] = tensor
        elif last:
            out[name] = tensor
    return out
