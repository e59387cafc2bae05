"""Build a Megatron-core ``GPTModel`` for one (PP stage, TP rank) from an fp8rl DecoderConfig.

The model is Megatron's (embedding, TransformerBlock, TransformerLayer, SelfAttention, MLP,
Column/RowParallelLinear and their TP communication) with fp8rl's layers plugged in through the
layer spec (``spec.py``). Parameters are float32 masters (``params_dtype``), activations run in
``precision.dtype`` (the embedding output is cast, as in the native decoder), dropout is off.

The output layer is turned into a *head*: ``GPTModel.forward`` returns the final hidden states
``[b, s, h]`` and ``head_logits`` computes the vocabulary-parallel logits only for the rows that
are scored (the response positions), as the native decoder does.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from megatron.core import parallel_state
from megatron.core.models.gpt import GPTModel
from megatron.core.tensor_parallel.mappings import gather_from_sequence_parallel_region
from megatron.core.transformer.transformer_config import TransformerConfig
from torch import Tensor

from fp8rl.workers.model.config import DecoderConfig
from fp8rl.workers.model.linear import LayerPrecision
from fp8rl.workers.trainer.megatron.convert import hf_to_megatron, shard, stage_view
from fp8rl.workers.trainer.megatron.layout import model_fit_problems, padded_vocab, stage_layers
from fp8rl.workers.trainer.megatron.linears import (
    LinearPlan,
    PlannedColumnParallelLinear,
    tp_input,
)
from fp8rl.workers.trainer.megatron.spec import block_spec


class HeadLinear(PlannedColumnParallelLinear):
    """The output layer as a head: ``forward`` passes hidden states through (gathered from the
    sequence-parallel region), ``logits`` runs the planned GEMM on the rows to score."""

    def forward(self, input_: Tensor, weight: Tensor | None = None, runtime_gather_output=None):
        if self.sequence_parallel:
            input_ = gather_from_sequence_parallel_region(input_, True, group=self.tp_group)
        return input_, None

    def logits(self, hidden: Tensor, weight: Tensor) -> Tensor:
        """``hidden [b, r, h]`` → this rank's vocabulary slice of the logits ``[b, r, V_pad/tp]``
        in the activation dtype (DGrad all-reduced over TP in backward)."""
        hidden = tp_input(
            hidden, sequence_parallel=False, allreduce_dgrad=_tp() > 1, group=self.tp_group
        )
        return self._local_gemm(hidden.transpose(0, 1), weight, None).transpose(0, 1)


def _tp() -> int:
    return parallel_state.get_tensor_model_parallel_world_size()


def transformer_config(
    config: DecoderConfig,
    *,
    tp: int,
    pp: int,
    sequence_parallel: bool,
    dtype: torch.dtype = torch.bfloat16,
) -> TransformerConfig:
    """Megatron's TransformerConfig for ``config``: RMSNorm, SwiGLU, GQA, no dropout, float32
    master parameters, CPU initialisation, no fused CUDA kernels; ``dtype`` is the activation
    dtype sent between pipeline stages."""
    return TransformerConfig(
        num_layers=config.num_hidden_layers,
        hidden_size=config.hidden_size,
        ffn_hidden_size=config.intermediate_size,
        num_attention_heads=config.num_attention_heads,
        num_query_groups=config.num_key_value_heads,
        kv_channels=config.head_dim,
        normalization="RMSNorm",
        layernorm_epsilon=config.rms_norm_eps,
        gated_linear_unit=True,
        activation_func=F.silu,
        add_bias_linear=False,
        add_qkv_bias=config.attention_bias,
        qk_layernorm=config.qk_norm,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        params_dtype=torch.float32,
        use_cpu_initialization=True,
        perform_initialization=True,
        tensor_model_parallel_size=tp,
        pipeline_model_parallel_size=pp,
        sequence_parallel=sequence_parallel,
        gradient_accumulation_fusion=False,
        bias_activation_fusion=False,
        bias_dropout_fusion=False,
        masked_softmax_fusion=False,
        persist_layer_norm=False,
        apply_rope_fusion=False,
        pipeline_dtype=dtype,
    )


def head_is_fp8(config: DecoderConfig, precision: LayerPrecision) -> bool:
    """Whether the output layer runs FP8 (an untied ``lm_head`` not kept in BF16)."""
    return not config.tie_word_embeddings and precision.linear_is_fp8(
        "lm_head", config.num_hidden_layers
    )


def build_gpt_model(
    config: DecoderConfig,
    precision: LayerPrecision,
    *,
    max_positions: int,
    sequence_parallel: bool = False,
) -> GPTModel:
    """This rank's GPTModel (Megatron's parallel state must be initialised).

    Raises:
        ValueError: the model does not split into this TP × PP (reasons listed), Qwen3-style
            q/k norms with TP > 1 … or an FP8 KV cache (not supported by the Megatron trainer).
    """
    tp, pp = _tp(), parallel_state.get_pipeline_model_parallel_world_size()
    problems = model_fit_problems(config, tp=tp, pp=pp, fp8=precision.fp8)
    if problems:
        raise ValueError("; ".join(problems))
    if precision.kv_fp8:
        raise ValueError(
            "precision.quant.kv_cache_dtype=fp8_e4m3 is not supported with trainer.backend="
            "megatron yet (the trainer would have to calibrate KV scales inside Megatron's "
            "attention); use kv_cache_dtype=auto"
        )
    pp_rank = parallel_state.get_pipeline_model_parallel_rank()
    fp8_head = head_is_fp8(config, precision)
    vocab = padded_vocab(config.vocab_size, tp, fp8_head=fp8_head)
    layers = stage_layers(config.num_hidden_layers, pp, pp_rank)
    mcfg = transformer_config(
        config, tp=tp, pp=pp, sequence_parallel=sequence_parallel, dtype=precision.dtype
    )
    model = GPTModel(
        config=mcfg,
        transformer_layer_spec=block_spec(
            config, precision, layers, tp=tp, max_positions=max_positions
        ),
        vocab_size=vocab,
        max_sequence_length=max_positions,
        pre_process=parallel_state.is_pipeline_first_stage(),
        post_process=parallel_state.is_pipeline_last_stage(),
        share_embeddings_and_output_weights=config.tie_word_embeddings,
        position_embedding_type="none",
    )
    if model.post_process:  # same parameters, head behaviour (see HeadLinear)
        plan = LinearPlan(
            fp8=fp8_head,
            scale_format=precision.quant.scale_format if fp8_head else "fp32",
            exact=precision.exact,
            parts=(vocab // tp,),
        )
        model.output_layer.__class__ = type("HeadLinear", (HeadLinear,), {"plan": plan})
    if model.pre_process:
        dtype = precision.dtype
        model.embedding.register_forward_hook(lambda _m, _i, out: out.to(dtype))
    model.fp8rl_config, model.fp8rl_precision = config, precision
    model.fp8rl_layers = layers
    return model


def head_weight(model: GPTModel) -> Tensor:
    """The output layer's weight on the last stage (the embedding when tied on one stage)."""
    if model.share_embeddings_and_output_weights:
        return model.shared_embedding_or_output_weight()
    return model.output_layer.weight


def load_hf_weights(model: GPTModel, hf: dict[str, Tensor]) -> None:
    """Copy an HF-named state dict into this rank's shard (conversion, TP shard, stage view).

    Raises:
        ValueError: names missing or unexpected after conversion (listed).
    """
    config: DecoderConfig = model.fp8rl_config
    tp, tp_rank = _tp(), parallel_state.get_tensor_model_parallel_rank()
    vocab = model.vocab_size
    full = hf_to_megatron(hf, config, vocab_padded=vocab)
    mine = stage_view(full, model.fp8rl_layers, first=model.pre_process, last=model.post_process)
    own = dict(model.named_parameters())
    missing, extra = sorted(set(own) - set(mine)), sorted(set(mine) - set(own))
    if missing or extra:
        raise ValueError(f"Megatron shard mismatch: missing {missing[:8]}, unexpected {extra[:8]}")
    with torch.no_grad():
        for name, param in own.items():
            piece = shard(_global_name(name, model), mine[name], tp=tp, tp_rank=tp_rank)
            if piece.shape != param.shape:
                raise ValueError(
                    f"{name}: shard {tuple(piece.shape)} != parameter {tuple(param.shape)}"
                )
            param.copy_(piece.to(param.dtype))
    for module in model.modules():
        if hasattr(module, "invalidate_quantized"):
            module.invalidate_quantized()


def _global_name(local: str, model: GPTModel) -> str:
    if not local.startswith("decoder.layers."):
        return local
    _, _, index, rest = local.split(".", 3)
    return f"decoder.layers.{int(index) + model.fp8rl_layers.start}.{rest}"


def forward_hidden(model: GPTModel, input_ids: Tensor, mask: Tensor) -> Tensor:
    """Final hidden states ``[b, s, h]`` (last stage; single-stage models).

    With sequence parallelism the rows are right-padded to a multiple of TP (Megatron scatters
    the sequence over the TP ranks) and the padding is cut off again; padded keys are invisible
    to real tokens (causal mask), so real rows are unchanged.

    Args:
        input_ids: ``[b, s]`` int64, right-padded.
        mask: ``[b, 1, s, s]`` bool visibility (``kernels.invariant.attention_mask``).
    """
    s = input_ids.shape[1]
    if model.config.sequence_parallel:
        pad = -s % _tp()
        input_ids = F.pad(input_ids, (0, pad))
        mask = F.pad(mask, (0, pad, 0, pad))
        mask[..., s:, 0] = True  # padded queries see key 0 (a row with no key is NaN)
    positions = torch.arange(input_ids.shape[1], device=input_ids.device).expand_as(input_ids)
    return model(input_ids, positions, mask)[:, :s]
