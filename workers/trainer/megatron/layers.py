"""Megatron layer modules that compute what fp8rl's native decoder computes (and run on CPU).

Megatron's own RoPE and attention call ``torch.cuda.current_device()``; these replacements use
``fp8rl.kernels.invariant`` (RMSNorm, rotate-half RoPE, masked GQA attention, SwiGLU), the
native decoder's ops, so the exact mode stays bitwise. The model is built with
``position_embedding_type="none"`` and RoPE is applied inside ``CoreAttention`` (after q/k norm,
as in the native decoder).

Tensor layouts are Megatron's: hidden ``[s, b, h]``, query ``[s, b, np, hn]``, key/value
``[s, b, ng, hn]``. ``attention_mask`` is fp8rl's boolean ``[b, 1, s, s]`` visibility mask
(True = visible, ``kernels.invariant.attention_mask``), not Megatron's inverted one.
"""

from __future__ import annotations

import torch
from megatron.core.transformer.mlp import MLP
from megatron.core.transformer.module import MegatronModule
from torch import Tensor, nn

from fp8rl.kernels.invariant import apply_rope, attention, rms_norm, rope_table, silu_mul
from fp8rl.workers.model.config import DecoderConfig


class RMSNorm(nn.Module):
    """RMSNorm with a learned gain (``kernels.invariant.rms_norm``); Megatron's norm signature.

    Class attribute ``exact`` (set by ``rms_norm_class``): batch-invariant kernel.
    """

    exact: bool = False

    def __init__(self, config, hidden_size: int, eps: float = 1e-5, **_: object) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.eps = eps
        # Sequence-parallel norms see a shard of tokens: Megatron all-reduces these grads over TP.
        self.weight.sequence_parallel = bool(getattr(config, "sequence_parallel", False))

    def forward(self, x: Tensor) -> Tensor:
        return rms_norm(x, self.weight, self.eps, exact=self.exact)


def rms_norm_class(exact: bool) -> type:
    """``RMSNorm`` with ``exact`` fixed (Megatron builds norms from a class)."""
    return type("RMSNorm", (RMSNorm,), {"exact": exact})


class CoreAttention(MegatronModule):
    """RoPE + masked GQA attention of the native decoder, on Megatron's ``[s, b, heads, hn]``.

    Class attributes (set by ``core_attention_class``): ``rope_cos``/``rope_sin`` float32
    ``[max_positions, hn]`` tables and ``exact``.
    """

    rope_cos: Tensor
    rope_sin: Tensor
    exact: bool = False

    def __init__(self, config, layer_number, attn_mask_type, attention_type, **_: object) -> None:
        super().__init__(config=config)
        self.layer_number = layer_number

    def forward(
        self,
        query: Tensor,
        key: Tensor,
        value: Tensor,
        attention_mask: Tensor,
        attn_mask_type=None,
        attention_bias=None,
        packed_seq_params=None,
    ) -> Tensor:
        """``[s, b, np, hn]`` queries, ``[s, b, ng, hn]`` keys/values → ``[s, b, np·hn]``.

        Positions are ``0..s-1`` (right-padded rows, keys at index = position).
        Raises ``ValueError`` past the RoPE table or for packed sequences.
        """
        if packed_seq_params is not None:
            raise ValueError("fp8rl's Megatron attention takes right-padded rows, not packed ones")
        s, b = query.shape[:2]
        if s > self.rope_cos.shape[0]:
            raise ValueError(
                f"sequence of {s} tokens exceeds max_positions {self.rope_cos.shape[0]}"
            )
        cos = self.rope_cos[:s].to(query.device).expand(b, s, -1)
        sin = self.rope_sin[:s].to(query.device).expand(b, s, -1)
        # [b, s, heads, hn] contiguous, as the native decoder's q_proj(x).view(b, s, heads, hn)
        q = apply_rope(query.transpose(0, 1).contiguous().transpose(1, 2), cos, sin)
        k = apply_rope(key.transpose(0, 1).contiguous().transpose(1, 2), cos, sin)
        v = value.transpose(0, 1).contiguous().transpose(1, 2)
        out = attention(q, k, v, attention_mask, scale=q.shape[-1] ** -0.5, exact=self.exact)
        return out.transpose(1, 2).reshape(b, s, -1).transpose(0, 1)


def core_attention_class(config: DecoderConfig, *, max_positions: int, exact: bool) -> type:
    """``CoreAttention`` with the model's RoPE table (Llama 3 scaling included) and ``exact``."""
    cos, sin = rope_table(config.head_dim, max_positions, config.inv_freq())
    return type(
        "CoreAttention", (CoreAttention,), {"rope_cos": cos, "rope_sin": sin, "exact": exact}
    )


class SwiGLUMLP(MLP):
    """Megatron MLP with fc1 = ``[gate; up]`` and the native ``silu_mul`` between fc1 and fc2.

    Class attribute ``exact`` (set by ``mlp_class``).
    """

    exact: bool = False

    def forward(self, hidden_states: Tensor, per_token_scale=None, **kwargs):
        """``[s, b, h]`` → ``(output [s, b, h], bias)`` as Megatron's MLP."""
        fused, _ = self.linear_fc1(hidden_states)
        gate, up = torch.chunk(fused, 2, dim=-1)
        return self.linear_fc2(silu_mul(gate, up, exact=self.exact))


def mlp_class(exact: bool) -> type:
    """``SwiGLUMLP`` with ``exact`` fixed."""
    return type("SwiGLUMLP", (SwiGLUMLP,), {"exact": exact})
