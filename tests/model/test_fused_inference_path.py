"""The fused fast inference path (issue 14): fused q/k/v and gate/up weights, fused norm/SwiGLU
quantization. On CPU every fused op is the unfused composition, so the fused decoder must be
bitwise equal to the unfused one; the GPU kernels are checked in tests/fp8_kernels."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from fp8rl.kernels import FP8Linear, per_block_quant
from fp8rl.protocol import QuantConfig
from fp8rl.workers.model.build import build_decoder
from fp8rl.workers.model.config import PRESETS
from fp8rl.workers.model.decoder import KVCache
from fp8rl.workers.model.linear import LayerPrecision

# q 256, k/v 128 each, intermediate 384: every projection a multiple of 128 rows (fusable)
CONFIG = replace(
    PRESETS["tiny-llama"],
    vocab_size=512,
    hidden_size=256,
    intermediate_size=384,
    num_attention_heads=4,
    num_key_value_heads=2,
    attention_bias=True,
)


def _engine_model(*, exact: bool = False):
    precision = LayerPrecision(
        dtype=torch.bfloat16, fp8=True, quant=QuantConfig(), exact=exact, trainable=False
    )
    return build_decoder(
        CONFIG, precision, state_dict=None, max_positions=64, param_dtype=torch.bfloat16, seed=3
    )


def _unfuse(model) -> None:
    for layer in model.model.layers:
        layer.self_attn.fused_qkv = None
        layer.mlp.fused_gate_up = None


def _decode_two_steps(model) -> torch.Tensor:
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, CONFIG.vocab_size, (3, 6), generator=gen)
    cache = KVCache.allocate(CONFIG, batch=3, capacity=16, dtype=torch.bfloat16, device="cpu")
    with torch.inference_mode():
        pos = torch.arange(6).expand(3, 6)
        outs = [model(ids, pos, torch.full((3,), 6), cache)]
        step = torch.randint(0, CONFIG.vocab_size, (3, 1), generator=gen)
        outs.append(model(step, torch.full((3, 1), 6), torch.full((3,), 7), cache))
    return torch.cat([o.reshape(-1) for o in outs])


def test_engine_model_runs_the_fused_path_and_equals_the_unfused_path_bitwise():
    model = _engine_model()
    for layer in model.model.layers:
        with torch.inference_mode():
            assert layer.fused_ready()
    fused = _decode_two_steps(model)
    _unfuse(model)
    with torch.inference_mode():
        assert not model.model.layers[0].fused_ready()
    unfused = _decode_two_steps(model)
    assert torch.equal(fused.view(torch.int16), unfused.view(torch.int16))


def test_weight_update_through_a_projection_reaches_the_fused_weight():
    model = _engine_model()
    attn = model.model.layers[0].self_attn
    new = per_block_quant(torch.randn(attn.k_proj.out_features, CONFIG.hidden_size))
    attn.k_proj.load_quantized(new)
    rows = slice(attn.q_proj.out_features, attn.q_proj.out_features + attn.k_proj.out_features)
    fused_codes = attn.fused_qkv.codes[rows].view(torch.uint8)
    assert torch.equal(fused_codes, new.codes.view(torch.uint8))
    scale_rows = slice(rows.start // 128, rows.stop // 128)
    assert torch.equal(attn.fused_qkv.scale[scale_rows], new.scale)


def test_replaced_buffers_switch_the_fused_path_off():
    model = _engine_model()
    mlp = model.model.layers[1].mlp
    mlp.up_proj.weight_codes = mlp.up_proj.weight_codes.clone()  # e.g. after module.to()
    with torch.inference_mode():
        assert not model.model.layers[1].fused_ready()
        assert model.model.layers[0].fused_ready()


@pytest.mark.parametrize("role", ["exact", "trainable"])
def test_exact_and_trainable_models_are_not_fused(role):
    if role == "exact":
        model = _engine_model(exact=True)
    else:
        precision = LayerPrecision(dtype=torch.bfloat16, fp8=True, quant=QuantConfig())
        model = build_decoder(
            CONFIG, precision, state_dict=None, max_positions=64, param_dtype=torch.bfloat16
        )
        assert isinstance(model.model.layers[0].mlp.up_proj, FP8Linear)
    with torch.inference_mode():
        assert not any(layer.fused_ready() for layer in model.model.layers)
