"""SGLang's rules as the fake enforces them, fp8rl's own start-up check of the same block-FP8
rules, and the pure protocol translations (sampling, outputs, buckets)."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch

from fp8rl.protocol import QuantConfig, SamplingParams, SGLangRollout
from fp8rl.workers.model.config import PRESETS
from fp8rl.workers.model.linear import LayerPrecision
from fp8rl.workers.rollout.sglang_adapter import (
    block_fp8_problems,
    buckets,
    engine_config,
    parse_output,
    sampling_params,
    server_args,
)
from fp8rl.workers.rollout.sglang_fake import FakeContractViolation, FakeSGLangEngine
from fp8rl.workers.rollout.vllm import expected_slots

TINY = PRESETS["tiny-llama"]
QKV_DENSE = ["embed_tokens", "lm_head", "q_proj", "k_proj", "v_proj"]


def _precision(bf16_modules: list[str], kv: str = "auto") -> LayerPrecision:
    quant = QuantConfig(bf16_modules=bf16_modules, kv_cache_dtype=kv)
    return LayerPrecision(fp8=True, quant=quant, trainable=False, kv_fp8=kv == "fp8_e4m3")


def _fake(tmp_path, precision: LayerPrecision, config=TINY, **spec) -> FakeSGLangEngine:
    slots = expected_slots(config, precision)
    (tmp_path / "config.json").write_text(json.dumps(engine_config(config, precision, slots)))
    kwargs = server_args(
        SGLangRollout(**spec), model_dir=str(tmp_path), dtype="bfloat16", max_model_len=64,
        kv_fp8=precision.kv_fp8, fp8=precision.fp8, seed=0,
    )  # fmt: skip
    return FakeSGLangEngine(**kwargs)


@pytest.mark.parametrize(
    "bf16_modules, refused",
    [
        (["embed_tokens", "lm_head"], True),  # k/v have 64 rows: not a 128-row block
        (QKV_DENSE, False),
        (["embed_tokens", "lm_head", "k_proj", "v_proj"], True),  # q FP8, k/v BF16: mixed shards
    ],
)
def test_fp8rl_check_and_the_fake_agree_on_what_sglang_refuses(tmp_path, bf16_modules, refused):
    precision = _precision(bf16_modules)
    assert bool(block_fp8_problems(TINY, precision, tp=1)) == refused
    if refused:
        with pytest.raises(ValueError, match=r"not divisible by|not all shards"):
            _fake(tmp_path, precision)
    else:
        _fake(tmp_path, precision)


def test_block_check_names_each_layer_and_the_fix():
    problems = block_fp8_problems(TINY, _precision(["embed_tokens", "lm_head"]), tp=1)
    assert "model.layers.0.self_attn.k_proj: 64 output rows per TP rank" in problems[0]
    assert "bf16_modules" in problems[0]
    assert len(problems) == 2 * TINY.num_hidden_layers  # k and v of each block


def test_tensor_parallel_splits_count_per_rank(tmp_path):
    wide = replace(TINY, num_attention_heads=4, num_key_value_heads=2, intermediate_size=512)
    precision = _precision(["embed_tokens", "lm_head"])
    assert block_fp8_problems(wide, precision, tp=1) == []
    _fake(tmp_path, precision, config=wide)
    assert any("per TP rank" in p for p in block_fp8_problems(wide, precision, tp=2))
    with pytest.raises(ValueError, match="output_partition_size = 64 is not divisible"):
        _fake(tmp_path, precision, config=wide, tensor_parallel_size=2)


def test_fake_refuses_updates_outside_a_session(tmp_path):
    fake = _fake(tmp_path, _precision(QKV_DENSE))
    ok, message = fake.update_weights_from_tensor([("model.norm.weight", torch.ones(128))])
    assert not ok and "between begin_weight_update() and end_weight_update()" in message
    assert fake.end_weight_update()[0] is False
    assert fake.begin_weight_update() == (True, "Success")
    assert fake.begin_weight_update()[0] is False


def test_fake_skips_unknown_names_and_half_applies_a_bad_shape(tmp_path):
    fake = _fake(tmp_path, _precision(QKV_DENSE))
    fake.begin_weight_update()
    ok, _ = fake.update_weights_from_tensor([("model.not_a_tensor", torch.ones(3))])
    assert ok and fake.dropped == ["model.not_a_tensor"]
    norm = torch.full((128,), 2.0, dtype=torch.bfloat16)
    ok, message = fake.update_weights_from_tensor(
        [("model.norm.weight", norm), ("model.layers.0.mlp.down_proj.weight", torch.ones(3, 3))]
    )
    assert not ok and "partially updated" in message
    assert torch.equal(fake.model.model.norm.weight, norm)  # written before the failure
    fake.end_weight_update()
    with pytest.raises(FakeContractViolation, match="partially updated"):
        fake.generate(input_ids=[[1, 2]], sampling_params=[{"max_new_tokens": 2}])


def test_fake_runs_only_registered_custom_loaders(tmp_path):
    fake = _fake(tmp_path, _precision(QKV_DENSE))
    fake.begin_weight_update()
    with pytest.raises(RuntimeError, match="scheduler died"):
        fake.update_weights_from_tensor([], load_format="some.module.loader")


def test_fake_defaults_unloaded_kv_scales_to_one_at_end(tmp_path):
    fake = _fake(tmp_path, _precision(QKV_DENSE, kv="fp8_e4m3"))
    name = "model.layers.0.self_attn.k_scale"
    fake.begin_weight_update()
    fake.update_weights_from_tensor([(name, torch.tensor(0.25))])
    fake.end_weight_update()
    assert fake.kv_params["model.layers.0.self_attn.attn.k_scale"] == 0.25
    assert fake.kv_params["model.layers.0.self_attn.attn.v_scale"] == 1.0


def test_sampling_params_seed_each_sample_like_the_vllm_backend():
    sp = SamplingParams(n=2, temperature=0.7, max_tokens=5, seed=10)
    params = [sampling_params(sp, [2], index=k) for k in range(4)]
    assert [p["sampling_seed"] for p in params] == [10, 11, 12, 13]
    assert params[0] == {
        "max_new_tokens": 5, "temperature": 0.7, "stop_token_ids": [2], "n": 1, "sampling_seed": 10,
    }  # fmt: skip
    assert "sampling_seed" not in sampling_params(SamplingParams(), [2], index=0)


def test_parse_output_reads_tokens_logprobs_and_finish_reason():
    out = {
        "output_ids": [5, 2],
        "meta_info": {
            "finish_reason": {"type": "stop", "matched": 2},
            "output_token_logprobs": [(-0.5, 5, None), (-1.25, 2, None)],
        },
    }
    assert parse_output(out) == ([5, 2], [-0.5, -1.25], "stop")
    aborted = {**out, "meta_info": {**out["meta_info"], "finish_reason": {"type": "abort"}}}
    with pytest.raises(RuntimeError, match="abort"):
        parse_output(aborted)
    shifted = {**out, "output_ids": [5, 3]}
    with pytest.raises(RuntimeError, match="other tokens"):
        parse_output(shifted)


def test_buckets_keep_order_and_size_with_a_large_tensor_alone():
    named = [(f"t{i}", torch.zeros(n, dtype=torch.uint8)) for i, n in enumerate([4, 4, 10, 3, 2])]
    groups = buckets(named, max_bytes=8)
    assert [[n for n, _ in g] for g in groups] == [["t0", "t1"], ["t2"], ["t3", "t4"]]
