"""HF ↔ Megatron conversion: bitwise round trips, QKV interleave, gate/up and vocab padding."""

from __future__ import annotations

import pytest
import torch
from megatron_configs import TINY_LLAMA, TINY_QWEN2, TP2_LLAMA, hf_state

from fp8rl.workers.trainer.megatron.convert import (
    hf_to_megatron,
    megatron_to_hf,
    qkv_native_order,
    shard,
    stage_view,
    unshard,
)
from fp8rl.workers.trainer.megatron.layout import padded_vocab


def _bitwise_equal(a: dict, b: dict) -> None:
    assert sorted(a) == sorted(b)
    for name in a:
        assert a[name].dtype == b[name].dtype and torch.equal(a[name], b[name]), name


@pytest.mark.parametrize("config", [TINY_LLAMA, TINY_QWEN2], ids=["llama-tied", "qwen2-bias"])
@pytest.mark.parametrize("tp", [1, 2])
def test_hf_megatron_hf_round_trip_is_bitwise_with_vocab_padding(config, tp):
    hf = hf_state(config)
    vocab = padded_vocab(config.vocab_size, tp, fp8_head=True)
    mg = hf_to_megatron(hf, config, vocab_padded=vocab)
    assert mg["embedding.word_embeddings.weight"].shape[0] == vocab
    assert ("output_layer.weight" in mg) != config.tie_word_embeddings
    assert torch.count_nonzero(mg["embedding.word_embeddings.weight"][config.vocab_size :]) == 0
    _bitwise_equal(megatron_to_hf(mg, config), hf)


def test_fused_qkv_is_interleaved_per_query_group():
    config = TINY_QWEN2  # 4 query heads, 2 groups, head_dim 64
    hf = hf_state(config)
    fused = hf_to_megatron(hf, config, vocab_padded=301)[
        "decoder.layers.0.self_attention.linear_qkv.weight"
    ]
    q, k, v = (hf[f"model.layers.0.self_attn.{p}_proj.weight"] for p in "qkv")
    hn = 64
    group1 = fused[4 * hn : 8 * hn]  # group 0 is q heads 0-1, k_0, v_0 (4 heads of rows)
    assert torch.equal(group1[: 2 * hn], q[2 * hn : 4 * hn])
    assert torch.equal(group1[2 * hn : 3 * hn], k[hn:])
    assert torch.equal(group1[3 * hn :], v[hn:])


@pytest.mark.parametrize("config", [TINY_QWEN2, TP2_LLAMA])
def test_tp_shards_unshard_bitwise_and_fc1_holds_gate_and_up_shards(config):
    mg = hf_to_megatron(
        hf_state(config), config, vocab_padded=padded_vocab(config.vocab_size, 2, fp8_head=False)
    )
    for name, full in mg.items():
        pieces = [shard(name, full, tp=2, tp_rank=r) for r in range(2)]
        assert torch.equal(unshard(name, pieces), full), name
    fc1 = shard(
        "decoder.layers.1.mlp.linear_fc1.weight",
        mg["decoder.layers.1.mlp.linear_fc1.weight"],
        tp=2,
        tp_rank=1,
    )
    half = config.intermediate_size // 2
    hf = hf_state(config)
    assert torch.equal(fc1[:half], hf["model.layers.1.mlp.gate_proj.weight"][half:])
    assert torch.equal(fc1[half:], hf["model.layers.1.mlp.up_proj.weight"][half:])


def test_qkv_native_order_recovers_each_ranks_q_k_v_shards():
    config, tp = TINY_QWEN2, 2
    hf = hf_state(config)
    full = hf_to_megatron(hf, config, vocab_padded=302)[
        "decoder.layers.0.self_attention.linear_qkv.weight"
    ]
    idx = qkv_native_order(config, tp)
    for rank in range(tp):
        local = shard(
            "decoder.layers.0.self_attention.linear_qkv.weight", full, tp=tp, tp_rank=rank
        )
        expected = torch.cat(
            [hf[f"model.layers.0.self_attn.{p}_proj.weight"].chunk(tp)[rank] for p in "qkv"]
        )
        assert torch.equal(local[idx], expected)


def test_stage_view_renumbers_layers_and_gives_the_tied_head_to_the_last_stage():
    config = TINY_LLAMA
    mg = hf_to_megatron(hf_state(config), config, vocab_padded=300)
    first = stage_view(mg, range(0, 1), first=True, last=False)
    last = stage_view(mg, range(1, 2), first=False, last=True)
    assert "embedding.word_embeddings.weight" in first and "output_layer.weight" not in first
    assert (
        "decoder.final_layernorm.weight" in last and "embedding.word_embeddings.weight" not in last
    )
    assert torch.equal(last["output_layer.weight"], mg["embedding.word_embeddings.weight"])
    assert torch.equal(
        last["decoder.layers.0.mlp.linear_fc2.weight"], mg["decoder.layers.1.mlp.linear_fc2.weight"]
    )


def test_mismatched_state_dict_is_refused_naming_the_missing_entry():
    hf = hf_state(TINY_LLAMA)
    del hf["model.layers.1.mlp.up_proj.weight"]
    with pytest.raises(ValueError, match=r"model\.layers\.1\.mlp\.up_proj\.weight"):
        hf_to_megatron(hf, TINY_LLAMA, vocab_padded=300)
