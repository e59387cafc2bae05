"""The fp8rl vLLM plugin: entry point, pickle-safe config, layer choice, slot contract, pins."""

from __future__ import annotations

import pickle

import pytest
from vllm_helpers import needs_vllm

needs_vllm()
pytestmark = pytest.mark.vllm

VLLM_VERSION = "0.32.0"
"""The vLLM release whose internals vllm_exact / vllm_plugin were written against."""


def test_the_plugin_is_a_vllm_general_plugins_entry_point():
    from importlib.metadata import entry_points

    (ep,) = [e for e in entry_points(group="vllm.general_plugins") if e.name == "fp8rl"]
    assert ep.value == "fp8rl.workers.rollout.vllm_plugin:register"
    ep.load()()
    from fp8rl.workers.rollout.vllm_plugin import is_registered

    assert is_registered()


def test_vllm_is_the_release_the_out_of_tree_hooks_were_written_for():
    """vllm_exact subclasses vLLM's RMSNorm/SiluAndMul/RotaryEmbedding/CPU attention and reads
    its CPU KV-cache layout; vllm_plugin reads its quantization registry. Re-check them (and
    the parity tests) before moving this pin."""
    import vllm

    assert vllm.__version__ == VLLM_VERSION


def _config(**quant):
    from fp8rl.protocol import QuantConfig
    from fp8rl.workers.rollout.vllm_plugin import FP8RLConfig, hf_quantization_config

    spec = hf_quantization_config(
        quant=QuantConfig(**quant).model_dump(mode="json"),
        fp8=True,
        exact=True,
        num_hidden_layers=4,
    )
    config = FP8RLConfig.from_config(spec)
    config.packed_modules_mapping = {
        "qkv_proj": ["q_proj", "k_proj", "v_proj"],
        "gate_up_proj": ["gate_proj", "up_proj"],
    }
    return config


def test_the_config_survives_pickling_into_engine_processes():
    config = _config(scale_format="pow2")
    clone = pickle.loads(pickle.dumps(config))
    assert type(clone) is type(config) and clone.quant == config.quant and clone.exact


def _layer(cls):
    return cls.__new__(cls)  # isinstance checks only: get_quant_method reads no attributes


def test_linear_layers_get_fp8_or_dense_methods_by_the_quant_config():
    from vllm.model_executor.layers.linear import QKVParallelLinear, RowParallelLinear
    from vllm.model_executor.layers.vocab_parallel_embedding import ParallelLMHead

    from fp8rl.workers.rollout.vllm_plugin import (
        DenseEmbeddingMethod,
        DenseLinearMethod,
        FP8RLLinearMethod,
    )

    config = _config(bf16_first_blocks=1)
    qkv = _layer(QKVParallelLinear)
    assert isinstance(
        config.get_quant_method(qkv, "model.layers.0.self_attn.qkv_proj"), DenseLinearMethod
    )
    assert isinstance(
        config.get_quant_method(qkv, "model.layers.1.self_attn.qkv_proj"), FP8RLLinearMethod
    )
    down = _layer(RowParallelLinear)
    assert isinstance(
        config.get_quant_method(down, "model.layers.2.mlp.down_proj"), FP8RLLinearMethod
    )
    assert isinstance(
        config.get_quant_method(_layer(ParallelLMHead), "lm_head"), DenseEmbeddingMethod
    )


def test_a_fused_layer_mixing_fp8_and_bf16_parts_is_refused_naming_them():
    from vllm.model_executor.layers.linear import QKVParallelLinear

    config = _config(bf16_modules=["embed_tokens", "lm_head", "q_proj"])
    with pytest.raises(ValueError, match=r"q_proj=bf16.*k_proj=fp8"):
        config.get_quant_method(_layer(QKVParallelLinear), "model.layers.1.self_attn.qkv_proj")


def test_an_fp8_lm_head_is_refused():
    from vllm.model_executor.layers.vocab_parallel_embedding import ParallelLMHead

    config = _config(bf16_modules=["embed_tokens"])
    with pytest.raises(ValueError, match="keep 'lm_head'"):
        config.get_quant_method(_layer(ParallelLMHead), "lm_head")


@pytest.mark.parametrize("mode", ["unified_fp8", "bf16"])
def test_expected_slots_are_the_native_engines_slots(mode):
    import torch

    from fp8rl.protocol import ModelSpec, PrecisionSpec
    from fp8rl.workers.common import load_model
    from fp8rl.workers.model.build import layer_precision
    from fp8rl.workers.model.loading import resolve_model
    from fp8rl.workers.rollout.vllm import expected_slots
    from fp8rl.workers.weight_sync.layout import engine_slots

    model, precision = (
        ModelSpec(path="random:tiny-llama", max_model_len=32),
        PrecisionSpec(mode=mode),
    )
    native, source = load_model(
        model, precision, role="rollout", trainable=False, device=torch.device("cpu"), seed=0
    )
    lp = layer_precision(model, precision, role="rollout", trainable=False)
    assert expected_slots(resolve_model(model.path, load_weights=False).config, lp) == engine_slots(
        native
    )
    assert source is not None


def test_top_k_in_the_rollout_spec_is_refused_before_vllm_starts():
    from fp8rl.protocol import ModelSpec, PrecisionSpec
    from fp8rl.protocol.rollout_spec import VLLMRollout
    from fp8rl.workers.rollout.vllm import VLLMRolloutWorker

    with pytest.raises(ValueError, match=r"rollout\.top_k=20"):
        VLLMRolloutWorker(
            ModelSpec(path="random:tiny-llama"), VLLMRollout(top_k=20), PrecisionSpec()
        )


def test_an_fp8_kv_cache_is_refused_before_vllm_starts():
    from fp8rl.protocol import ModelSpec, PrecisionSpec, QuantConfig
    from fp8rl.protocol.rollout_spec import VLLMRollout
    from fp8rl.workers.rollout.vllm import VLLMRolloutWorker

    precision = PrecisionSpec(quant=QuantConfig(kv_cache_dtype="fp8_e4m3"))
    with pytest.raises(ValueError, match="kv_cache_dtype"):
        VLLMRolloutWorker(ModelSpec(path="random:tiny-llama"), VLLMRollout(), precision)


def test_sleep_mode_on_a_cpu_build_is_refused_naming_the_field():
    from fp8rl.protocol import ModelSpec, PrecisionSpec
    from fp8rl.protocol.rollout_spec import VLLMRollout
    from fp8rl.workers.rollout.vllm import VLLMRolloutWorker

    with pytest.raises(ValueError, match=r"rollout\.enable_sleep_mode needs vLLM on CUDA"):
        VLLMRolloutWorker(
            ModelSpec(path="random:tiny-llama", max_model_len=32),
            VLLMRollout(enable_sleep_mode=True),
            PrecisionSpec(),
            device="cpu",
        )
