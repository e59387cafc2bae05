"""fp8rl's FP8 linear inside Megatron's Column/RowParallelLinear, and the layer spec's choices."""

from __future__ import annotations

import pytest
import torch
from megatron_configs import TINY_QWEN2

from fp8rl.kernels import FP8Linear
from fp8rl.protocol import QuantConfig
from fp8rl.workers.model.linear import LayerPrecision
from fp8rl.workers.trainer.megatron.linears import (
    LinearPlan,
    PlannedColumnParallelLinear,
    PlannedRowParallelLinear,
    planned,
)


def _megatron_config():
    from fp8rl.workers.trainer.megatron.model import transformer_config

    return transformer_config(TINY_QWEN2, tp=1, pp=1, sequence_parallel=False)


@pytest.mark.parametrize("base", [PlannedColumnParallelLinear, PlannedRowParallelLinear])
def test_fp8_forward_impl_forward_and_backward_equal_fp8linear(single_rank, base):
    torch.manual_seed(0)
    k, n = 256, 384
    reference = FP8Linear(k, n, bias=False, exact=True)
    cls = planned(base, LinearPlan(fp8=True, exact=True, parts=(n,)))
    extra = (
        {"gather_output": False}
        if base is PlannedColumnParallelLinear
        else {"input_is_parallel": True}
    )
    layer = cls(
        k,
        n,
        config=_megatron_config(),
        init_method=torch.nn.init.zeros_,
        bias=False,
        skip_bias_add=False,
        **extra,
    )
    with torch.no_grad():
        layer.weight.copy_(reference.weight)
    x = torch.randn(3, 5, k, dtype=torch.bfloat16)  # native [b, s, k]
    x_ref, x_mg = x.clone().requires_grad_(), x.transpose(0, 1).clone().requires_grad_()
    y_ref = reference(x_ref)
    y_mg, _ = layer(x_mg)  # Megatron [s, b, k]
    assert torch.equal(y_mg.transpose(0, 1), y_ref)
    grad = torch.randn_like(y_ref)
    y_ref.backward(grad)
    y_mg.backward(grad.transpose(0, 1))
    assert torch.equal(x_mg.grad.transpose(0, 1), x_ref.grad)
    assert torch.equal(layer.weight.grad, reference.weight.grad)


def test_fused_qkv_quantizes_each_native_part_like_its_own_fp8linear(single_rank):
    """q, k and v are quantized separately (a 128-row block never mixes q and k rows)."""
    from fp8rl.workers.trainer.megatron.convert import qkv_native_order

    torch.manual_seed(0)
    h, hn = 128, 64
    q, k, v = (FP8Linear(h, rows, bias=True, exact=True) for rows in (2 * hn, hn, hn))
    plan = LinearPlan(
        fp8=True,
        exact=True,
        parts=(2 * hn, hn, hn),
        order=tuple(qkv_native_order(_one_group(), 1).tolist()),
    )
    layer = planned(PlannedColumnParallelLinear, plan)(
        h,
        4 * hn,
        config=_megatron_config(),
        init_method=torch.nn.init.zeros_,
        bias=True,
        gather_output=False,
        skip_bias_add=False,
    )
    native_w = torch.cat([q.weight, k.weight, v.weight])
    native_b = torch.cat([q.bias, k.bias, v.bias])
    order = torch.tensor(plan.order)
    with torch.no_grad():  # local row order[j] holds native row j
        layer.weight[order] = native_w
        layer.bias[order] = native_b
    x = torch.randn(2, 7, h, dtype=torch.bfloat16)
    with torch.no_grad():
        y, _ = layer(x.transpose(0, 1))
        expected = torch.cat([q(x), k(x), v(x)], dim=-1)
    assert torch.equal(y.transpose(0, 1)[..., order], expected)


def _one_group():
    from dataclasses import replace

    return replace(TINY_QWEN2, num_attention_heads=2, num_key_value_heads=1, hidden_size=128)


def test_layer_spec_honours_bf16_blocks_and_modules(single_rank):
    from fp8rl.workers.trainer.megatron.spec import layer_spec, linear_fp8

    quant = QuantConfig(bf16_first_blocks=1, bf16_modules=["embed_tokens", "lm_head", "down_proj"])
    precision = LayerPrecision(dtype=torch.bfloat16, fp8=True, quant=quant)
    spec1 = layer_spec(TINY_QWEN2, precision, 1, tp=1, max_positions=64).submodules
    spec0 = layer_spec(TINY_QWEN2, precision, 0, tp=1, max_positions=64).submodules
    assert spec1.self_attention.submodules.linear_qkv.plan.fp8
    assert spec1.mlp.submodules.linear_fc1.plan.fp8
    assert not spec1.mlp.submodules.linear_fc2.plan.fp8  # down_proj kept in BF16
    assert not spec0.self_attention.submodules.linear_qkv.plan.fp8  # first block kept in BF16
    dense = LayerPrecision(dtype=torch.bfloat16)
    assert not layer_spec(
        TINY_QWEN2, dense, 1, tp=1, max_positions=64
    ).submodules.mlp.submodules.linear_fc1.plan.fp8
    partial = LayerPrecision(
        dtype=torch.bfloat16, fp8=True, quant=QuantConfig(bf16_modules=["k_proj"])
    )
    with pytest.raises(ValueError, match="linear_qkv"):
        linear_fp8(partial, 1, "linear_qkv", 2)


def test_fp8_kv_cache_is_refused_with_a_clear_message(single_rank):
    from fp8rl.workers.trainer.megatron.model import build_gpt_model

    precision = LayerPrecision(
        dtype=torch.bfloat16, fp8=True, quant=QuantConfig(kv_cache_dtype="fp8_e4m3"), kv_fp8=True
    )
    with pytest.raises(ValueError, match="kv_cache_dtype=fp8_e4m3 is not supported"):
        build_gpt_model(TINY_QWEN2, precision, max_positions=64)
