"""Megatron layer specs: per decoder layer, FP8 or dense parallel linears as the native decoder.

Which linears run FP8 follows ``LayerPrecision`` exactly as ``make_linear`` does for the native
decoder: the precision mode, ``QuantConfig.bf16_modules`` (HF module names) and
``bf16_first_blocks`` / ``bf16_last_blocks``. A Megatron linear fuses several HF modules
(``linear_qkv`` = q/k/v, ``linear_fc1`` = gate/up); those must agree.
"""

from __future__ import annotations

from megatron.core.transformer.attention import SelfAttention, SelfAttentionSubmodules
from megatron.core.transformer.enums import AttnMaskType
from megatron.core.transformer.identity_op import IdentityOp
from megatron.core.transformer.mlp import MLPSubmodules
from megatron.core.transformer.spec_utils import ModuleSpec
from megatron.core.transformer.transformer_block import TransformerBlockSubmodules
from megatron.core.transformer.transformer_layer import TransformerLayer, TransformerLayerSubmodules

from fp8rl.workers.model.config import DecoderConfig
from fp8rl.workers.model.linear import LayerPrecision
from fp8rl.workers.trainer.megatron.convert import qkv_native_order
from fp8rl.workers.trainer.megatron.layers import core_attention_class, mlp_class, rms_norm_class
from fp8rl.workers.trainer.megatron.linears import (
    LinearPlan,
    PlannedColumnParallelLinear,
    PlannedRowParallelLinear,
    planned,
)

FUSED = {  # Megatron linear → the HF modules it holds (relative to model.layers.<i>.)
    "linear_qkv": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
    "linear_proj": ("self_attn.o_proj",),
    "linear_fc1": ("mlp.gate_proj", "mlp.up_proj"),
    "linear_fc2": ("mlp.down_proj",),
}


def linear_fp8(precision: LayerPrecision, layer: int, linear: str, num_layers: int) -> bool:
    """Whether Megatron ``linear`` of decoder layer ``layer`` runs FP8.

    Raises:
        ValueError: the QuantConfig keeps only some of the HF modules fused into ``linear`` dense.
    """
    names = [f"model.layers.{layer}.{m}" for m in FUSED[linear]]
    flags = {n: precision.linear_is_fp8(n, num_layers) for n in names}
    if len(set(flags.values())) > 1:
        raise ValueError(
            f"QuantConfig.bf16_modules keeps only some of {names} in BF16; Megatron fuses them "
            f"into one {linear}: keep all or none"
        )
    return next(iter(flags.values()))


def _plan(precision: LayerPrecision, fp8: bool, parts: tuple[int, ...], order=None) -> LinearPlan:
    return LinearPlan(
        fp8=fp8,
        scale_format=precision.quant.scale_format if fp8 else "fp32",
        exact=precision.exact,
        parts=parts,
        order=order,
    )


def layer_spec(
    config: DecoderConfig, precision: LayerPrecision, layer: int, *, tp: int, max_positions: int
) -> ModuleSpec:
    """The TransformerLayer spec of global decoder layer ``layer`` on a TP ``tp`` rank."""
    c, n = config, config.num_hidden_layers
    q_rows = c.num_attention_heads * c.head_dim // tp
    kv_rows = c.num_key_value_heads * c.head_dim // tp
    ffn = c.intermediate_size // tp
    qkv_order = tuple(qkv_native_order(c, tp).tolist())
    fp8 = {name: linear_fp8(precision, layer, name, n) for name in FUSED}
    norm = rms_norm_class(precision.exact)
    return ModuleSpec(
        module=TransformerLayer,
        submodules=TransformerLayerSubmodules(
            input_layernorm=norm,
            self_attention=ModuleSpec(
                module=SelfAttention,
                params={"attn_mask_type": AttnMaskType.causal},
                submodules=SelfAttentionSubmodules(
                    linear_qkv=planned(
                        PlannedColumnParallelLinear,
                        _plan(precision, fp8["linear_qkv"], (q_rows, kv_rows, kv_rows), qkv_order),
                    ),
                    core_attention=core_attention_class(
                        c, max_positions=max_positions, exact=precision.exact
                    ),
                    linear_proj=planned(
                        PlannedRowParallelLinear,
                        _plan(precision, fp8["linear_proj"], (c.hidden_size,)),
                    ),
                    q_layernorm=norm if c.qk_norm else IdentityOp,
                    k_layernorm=norm if c.qk_norm else IdentityOp,
                ),
            ),
            self_attn_bda=_bda(),
            pre_mlp_layernorm=norm,
            mlp=ModuleSpec(
                module=mlp_class(precision.exact),
                submodules=MLPSubmodules(
                    linear_fc1=planned(
                        PlannedColumnParallelLinear, _plan(precision, fp8["linear_fc1"], (ffn, ffn))
                    ),
                    linear_fc2=planned(
                        PlannedRowParallelLinear,
                        _plan(precision, fp8["linear_fc2"], (c.hidden_size,)),
                    ),
                ),
            ),
            mlp_bda=_bda(),
        ),
    )


def _bda():
    from megatron.core.fusions.fused_bias_dropout import get_bias_dropout_add

    return get_bias_dropout_add


def block_spec(
    config: DecoderConfig,
    precision: LayerPrecision,
    layers: range,
    *,
    tp: int,
    max_positions: int,
) -> TransformerBlockSubmodules:
    """The TransformerBlock submodules of a pipeline stage holding global ``layers``."""
    return TransformerBlockSubmodules(
        layer_specs=[
            layer_spec(config, precision, i, tp=tp, max_positions=max_positions) for i in layers
        ],
        layer_norm=rms_norm_class(precision.exact),
    )
