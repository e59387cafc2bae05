"""Rank layout (tp-dp-pp order), stage layers, vocab padding and model-fit checks."""

from __future__ import annotations

import pytest
from megatron_configs import TINY_LLAMA, TINY_QWEN2, TP2_LLAMA

from fp8rl.workers.model.config import PRESETS
from fp8rl.workers.trainer.megatron.layout import (
    ParallelLayout,
    model_fit_problems,
    padded_vocab,
    stage_layers,
)


def test_coords_and_rank_are_inverse_with_tp_fastest():
    layout = ParallelLayout.from_world(16, tp=2, pp=2)
    assert layout.dp == 4
    assert [layout.coords(r) for r in (0, 1, 2, 8)] == [(0, 0, 0), (1, 0, 0), (0, 1, 0), (0, 0, 1)]
    assert all(layout.rank(*layout.coords(r)) == r for r in range(16))
    assert "TP 2 × PP 2 × DP 4" in layout.describe()


def test_world_not_divisible_by_model_parallel_is_refused():
    with pytest.raises(ValueError, match="TP=4"):
        ParallelLayout.from_world(6, tp=4, pp=1)


def test_stage_layers_split_evenly_or_refuse():
    assert list(stage_layers(8, 4, 3)) == [6, 7]
    with pytest.raises(ValueError):
        stage_layers(7, 2, 0)


def test_padded_vocab_is_whole_blocks_per_rank_only_for_an_fp8_head():
    assert padded_vocab(300, 1, fp8_head=True) == 300
    assert padded_vocab(301, 2, fp8_head=False) == 302
    assert padded_vocab(301, 2, fp8_head=True) == 512


def test_llama8b_fits_fp8_tp8_but_qwen25_7b_does_not():
    assert model_fit_problems(PRESETS["llama-3.1-8b"], tp=8, pp=4, fp8=True) == []
    problems = model_fit_problems(PRESETS["qwen2.5-7b"], tp=8, pp=1, fp8=True)
    assert "num_key_value_heads (4) is not divisible by TP 8" in problems
    assert model_fit_problems(PRESETS["qwen2.5-7b"], tp=4, pp=1, fp8=True) == []


def test_tiny_configs_fit_their_tests():
    assert model_fit_problems(TP2_LLAMA, tp=2, pp=2, fp8=True) == []
    half_blocks = model_fit_problems(TINY_QWEN2, tp=2, pp=1, fp8=True)  # one 64-row KV head
    assert len(half_blocks) == 1 and "k_proj/v_proj rows (64)" in half_blocks[0]
    assert model_fit_problems(TINY_QWEN2, tp=2, pp=1, fp8=False) == []
    assert "num_key_value_heads (1) is not divisible by TP 2" in model_fit_problems(
        TINY_LLAMA, tp=2, pp=1, fp8=False
    )
