"""The shared decoder: real SmolLM2 loads with its tokenizer and matches transformers' logits."""

from __future__ import annotations

import pytest
import torch

from fp8rl.workers.model.build import build_decoder
from fp8rl.workers.model.config import PRESETS, DecoderConfig
from fp8rl.workers.model.linear import LayerPrecision
from fp8rl.workers.model.loading import load_tokenizer, resolve_model

PROMPTS = ["What is 12+7?", "The capital of France is", "Write a haiku about the sea."]


@pytest.fixture(scope="module")
def smollm2():
    source = resolve_model("builtin:smollm2-135m-instruct")
    return source, load_tokenizer(source.tokenizer_dir)


def _chat_ids(tokenizer, text):
    ids = tokenizer.apply_chat_template(
        [{"role": "user", "content": text}], add_generation_prompt=True
    )
    return list(ids["input_ids"] if hasattr(ids, "keys") else ids)


def test_smollm2_loads_with_tokenizer_and_chat_template(smollm2):
    source, tokenizer = smollm2
    assert source.config.num_hidden_layers == 30 and source.config.tie_word_embeddings
    assert tokenizer.chat_template and tokenizer.eos_token_id in source.config.eos_token_id
    text = tokenizer.decode(_chat_ids(tokenizer, "hi"))
    assert "<|im_start|>user\nhi<|im_end|>" in text and text.endswith("<|im_start|>assistant\n")


def test_logits_equal_transformers_within_fp32_tolerance(smollm2):
    from transformers import AutoModelForCausalLM

    source, tokenizer = smollm2
    ours = build_decoder(
        source.config,
        LayerPrecision(dtype=torch.float32),
        state_dict=source.state_dict,
        max_positions=256,
        param_dtype=torch.float32,
    ).eval()
    theirs = AutoModelForCausalLM.from_pretrained(source.tokenizer_dir, dtype=torch.float32).eval()
    ids = [_chat_ids(tokenizer, p) for p in PROMPTS]
    width = max(map(len, ids))
    batch = torch.full((len(ids), width), tokenizer.pad_token_id)
    for i, row in enumerate(ids):
        batch[i, : len(row)] = torch.tensor(row)
    lens = torch.tensor([len(r) for r in ids])
    with torch.no_grad():
        logits = ours.logits(ours(batch, torch.arange(width).expand(len(ids), width), lens))
        ref = theirs(
            input_ids=batch, attention_mask=(torch.arange(width)[None] < lens[:, None]).long()
        ).logits
    for i, n in enumerate(lens.tolist()):
        torch.testing.assert_close(logits[i, :n], ref[i, :n], rtol=1e-4, atol=5e-4)


def test_llama3_rope_scaling_matches_transformers():
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    cfg = PRESETS["llama-3.1-8b"]
    hf = LlamaConfig(**{k: v for k, v in cfg.hf_config().items() if k not in ("architectures",)})
    inv_freq, _ = ROPE_INIT_FUNCTIONS["llama3"](hf, device="cpu")
    torch.testing.assert_close(cfg.inv_freq().float(), inv_freq.float(), rtol=1e-6, atol=0)


@pytest.mark.parametrize("preset", ["tiny-llama", "tiny-qwen3"])
def test_qwen3_and_llama_presets_run_forward_and_backward(preset):
    cfg: DecoderConfig = PRESETS[preset]
    model = build_decoder(
        cfg,
        LayerPrecision(dtype=torch.bfloat16),
        state_dict=None,
        max_positions=64,
        param_dtype=torch.float32,
    )
    ids = torch.randint(0, cfg.vocab_size, (2, 10))
    hidden = model(ids, torch.arange(10).expand(2, 10), torch.tensor([10, 7]))
    model.logits(hidden).float().logsumexp(-1).mean().backward()
    assert model.model.layers[0].self_attn.q_proj.weight.grad is not None
    assert (model.model.layers[0].self_attn.q_norm is not None) == (preset == "tiny-qwen3")


def test_bf16_kept_modules_and_blocks_stay_dense():
    from fp8rl.kernels import FP8Linear
    from fp8rl.protocol import QuantConfig
    from fp8rl.workers.model.linear import DenseLinear

    quant = QuantConfig(bf16_modules=["embed_tokens", "lm_head", "down_proj"], bf16_first_blocks=1)
    model = build_decoder(
        PRESETS["tiny-qwen3"],
        LayerPrecision(fp8=True, quant=quant),
        state_dict=None,
        max_positions=32,
        param_dtype=torch.float32,
    )
    first, second = model.model.layers
    assert isinstance(first.self_attn.q_proj, DenseLinear)
    assert isinstance(second.self_attn.q_proj, FP8Linear)
    assert isinstance(second.mlp.down_proj, DenseLinear)
    assert isinstance(model.lm_head, DenseLinear)


def test_missing_checkpoint_tensor_is_reported_by_name():
    cfg = PRESETS["tiny-llama"]
    model = build_decoder(
        cfg, LayerPrecision(), state_dict=None, max_positions=16, param_dtype=torch.float32
    )
    state = dict(model.state_dict())
    state.pop("model.layers.1.mlp.up_proj.weight")
    with pytest.raises(ValueError, match=r"missing \['model.layers.1.mlp.up_proj.weight'\]"):
        build_decoder(
            cfg, LayerPrecision(), state_dict=state, max_positions=16, param_dtype=torch.float32
        )


def test_unknown_model_path_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        resolve_model(str(tmp_path / "nope"))
    (tmp_path / "config.json").write_text('{"model_type": "gpt2"}')
    with pytest.raises(ValueError, match="model_type 'gpt2' is not supported"):
        resolve_model(str(tmp_path))


@pytest.mark.parametrize("family", ["qwen2", "qwen3", "llama3"])
def test_hf_directory_of_each_family_matches_transformers(family, tmp_path):
    """Qwen2.5 (q/k/v bias), Qwen3 (q/k norm, untied) and Llama 3.1 (rope scaling) from sharded
    safetensors directories give transformers' logits."""
    from transformers import AutoModelForCausalLM, LlamaConfig, Qwen2Config, Qwen3Config

    common = dict(
        vocab_size=512,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
    )
    if family == "qwen2":
        hf_cfg = Qwen2Config(**common, tie_word_embeddings=False)
    elif family == "qwen3":
        hf_cfg = Qwen3Config(**common, head_dim=32, tie_word_embeddings=False)
    else:
        hf_cfg = LlamaConfig(
            **common,
            rope_scaling={
                "rope_type": "llama3",
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 64,
            },
        )
    torch.manual_seed(0)
    theirs = AutoModelForCausalLM.from_config(hf_cfg).eval()
    if family == "qwen2":
        for layer in theirs.model.layers:  # random biases, so a dropped bias would show
            torch.nn.init.normal_(layer.self_attn.q_proj.bias, std=0.5)
    theirs.save_pretrained(tmp_path, max_shard_size="200KB")
    assert (tmp_path / "model.safetensors.index.json").exists()
    source = resolve_model(str(tmp_path))
    ours = build_decoder(
        source.config,
        LayerPrecision(dtype=torch.float32),
        state_dict=source.state_dict,
        max_positions=256,
        param_dtype=torch.float32,
    ).eval()
    ids = torch.randint(0, 512, (2, 40))
    with torch.no_grad():
        mine = ours.logits(ours(ids, torch.arange(40).expand(2, 40), torch.tensor([40, 40])))
        ref = theirs(input_ids=ids).logits
    torch.testing.assert_close(mine, ref, rtol=1e-4, atol=1e-4)
