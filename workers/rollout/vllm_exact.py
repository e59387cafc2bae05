"""fp8rl's non-GEMM ops inside vLLM: RMSNorm, SwiGLU, RoPE and (CPU, exact mode) attention.

Design notes
------------
The FP8 GEMMs alone do not make vLLM compute the trainer's logits: vLLM's own kernels round
differently — RoPE reads a cos/sin table *stored in the model dtype* (BF16) where fp8rl keeps it
in FP32, RMSNorm and SiLU run fused FP32 kernels where fp8rl's exact mode reduces in float64, and
the paged attention kernel accumulates in FP32 in its own order. Each BF16 rounding difference
then moves some 1×128 activation scale or FP8 code, and the logprobs drift by 1e-2..1e-1 on
SmolLM2 (measured; docs/results/vllm-parity.md).

So the plugin also swaps these layers through vLLM's out-of-tree hooks — ``CustomOp.register_oot``
for ``RMSNorm``, ``SiluAndMul`` and ``RotaryEmbedding`` and ``register_backend`` for the
``CPU_ATTN`` attention backend — with subclasses that call ``fp8rl.kernels.invariant`` (the
shared decoder's functions, with their ``exact`` path). The swap is process-wide (that is how
vLLM's hooks work), so every subclass decides at construction: it uses fp8rl's math only when
the engine being built runs the ``fp8rl`` quantization method, and behaves exactly like vLLM's
class otherwise. Shapes it does not cover (partial rotary, non-NeoX RoPE, sliding window, ALiBi,
soft-cap, sinks, FP8 KV cache, encoder attention) keep vLLM's path too.

Exact attention writes the keys/values into vLLM's paged KV cache tensor itself, in a plain
row-major layout (``_paged_kv``; vLLM's own layout differs per CPU ISA: AMX packs keys for its
tile kernel), reads every sequence back through the block table and runs ``invariant.attention``
over keys at index = position: the trainer's causal row, bit for bit. It is a Python loop over the sequences
of a step — slow, but only used for ``precision.exact`` on CPU, where the FP8 GEMM emulation
dominates anyway. On CUDA, attention stays vLLM's kernel (documented limit).
"""

from __future__ import annotations

import torch
from torch import Tensor
from vllm.model_executor.custom_op import op_registry_oot
from vllm.model_executor.layers.activation import SiluAndMul
from vllm.model_executor.layers.layernorm import RMSNorm
from vllm.model_executor.layers.rotary_embedding.base import RotaryEmbedding
from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend, CPUAttentionBackendImpl

from fp8rl.kernels.invariant import (
    apply_rope,
    attention,
    attention_mask,
    rms_norm,
    rope_table,
    silu_mul,
)


def fp8rl_engine() -> tuple[bool, bool]:
    """(the vLLM engine being built runs the ``fp8rl`` quantization, its ``exact`` flag)."""
    from vllm.config import get_current_vllm_config_or_none

    from fp8rl.workers.rollout.vllm_plugin import FP8RLConfig

    config = get_current_vllm_config_or_none()
    quant = getattr(config, "quant_config", None)
    if isinstance(quant, FP8RLConfig):
        return True, quant.exact
    return False, False


class FP8RLRMSNorm(RMSNorm):
    """vLLM RMSNorm → ``invariant.rms_norm``; with a residual, the BF16 sum is normalised (the
    trainer's ``x + attn(...)`` then ``norm``). Returns like vLLM: ``out`` or ``(out, sum)``."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        active, self.fp8rl_exact_math = fp8rl_engine()
        self.fp8rl_active = active and self.has_weight and self.variance_size_override is None

    def forward(self, x: Tensor, residual: Tensor | None = None):
        if not self.fp8rl_active:
            return super().forward(x, residual)
        if residual is None:
            return rms_norm(x, self.weight, self.variance_epsilon, exact=self.fp8rl_exact_math)
        total = x + residual
        return rms_norm(
            total, self.weight, self.variance_epsilon, exact=self.fp8rl_exact_math
        ), total


class FP8RLSiluAndMul(SiluAndMul):
    """vLLM SiluAndMul (``x = [gate | up]``) → ``invariant.silu_mul(gate, up)``."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.fp8rl_active, self.fp8rl_exact_math = fp8rl_engine()

    def forward(self, x: Tensor) -> Tensor:
        if not self.fp8rl_active:
            return super().forward(x)
        d = x.shape[-1] // 2
        return silu_mul(x[..., :d], x[..., d:], exact=self.fp8rl_exact_math)


class FP8RLRotaryEmbedding(RotaryEmbedding):
    """vLLM's default RoPE → fp8rl's FP32 cos/sin table (``invariant.rope_table``, computed in
    float64) and ``invariant.apply_rope``. query/key: [T, heads*D] (or [T, heads, D])."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        active, _ = fp8rl_engine()
        self.fp8rl_active = active and self.is_neox_style and self.rotary_dim == self.head_size
        if self.fp8rl_active:
            dim = self.head_size
            inv = 1.0 / (self.base ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))
            cos, sin = rope_table(dim, self.max_position_embeddings, inv)
            self.register_buffer("fp8rl_cos", cos, persistent=False)
            self.register_buffer("fp8rl_sin", sin, persistent=False)

    def _rotate(self, x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
        shape = x.shape
        heads = x.reshape(x.shape[0], -1, self.head_size).transpose(0, 1)[None]  # [1, H, T, D]
        out = apply_rope(heads, cos[None], sin[None])
        return out[0].transpose(0, 1).reshape(shape)

    def forward(self, positions: Tensor, query: Tensor, key: Tensor | None = None):
        if not self.fp8rl_active:
            return super().forward(positions, query, key)
        positions = positions.flatten()
        cos, sin = self.fp8rl_cos[positions], self.fp8rl_sin[positions]
        query = self._rotate(query, cos, sin)
        return query, None if key is None else self._rotate(key, cos, sin)


class FP8RLCPUAttentionImpl(CPUAttentionBackendImpl):
    """CPU attention; in an exact fp8rl engine ``invariant.attention(exact=True)`` per sequence
    over the paged KV cache (see the module notes), else vLLM's kernel."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        from vllm.v1.attention.backend import AttentionType

        active, exact = fp8rl_engine()
        self.fp8rl_active = (
            active
            and exact
            and self.attn_type == AttentionType.DECODER
            and self.sliding_window == -1
            and self.alibi_slopes is None
            and not self.logits_soft_cap
            and self.sinks is None
            and not self.is_fp8_kv_cache
        )

    def forward(self, layer, query, key, value, kv_cache, attn_metadata, output, *args, **kwargs):
        if not self.fp8rl_active or attn_metadata is None:
            return super().forward(
                layer, query, key, value, kv_cache, attn_metadata, output, *args, **kwargs
            )
        key_cache, value_cache = _paged_kv(kv_cache)
        block_size, kv_heads = key_cache.shape[2], key_cache.shape[1]
        starts = attn_metadata.query_start_loc.tolist()
        table = attn_metadata.block_table
        n = attn_metadata.num_actual_tokens
        out = output[:n].view(-1, self.num_heads, self.head_size)
        q_all = query[:n].view(-1, self.num_heads, self.head_size)
        for r, seq_len in enumerate(attn_metadata.seq_lens.tolist()):
            q0, q1 = starts[r], starts[r + 1]
            if q1 == q0:
                continue
            blocks = table[r, : -(-seq_len // block_size)].long()
            k = key_cache[blocks].transpose(0, 1).reshape(kv_heads, -1, self.head_size)
            v = value_cache[blocks].transpose(0, 1).reshape(kv_heads, -1, self.head_size)
            q_pos = torch.arange(seq_len - (q1 - q0), seq_len, device=query.device)[None]
            mask = attention_mask(q_pos, torch.tensor([seq_len], device=query.device), seq_len)
            q = q_all[q0:q1].transpose(0, 1)[None]  # [1, H, Lq, D]
            res = attention(
                q, k[None, :, :seq_len], v[None, :, :seq_len], mask, scale=self.scale, exact=True
            )
            out[q0:q1] = res[0].transpose(0, 1)
        return output

    def do_kv_cache_update(self, layer, key, value, kv_cache, slot_mapping) -> None:
        """In an exact fp8rl engine, write K/V into the paged cache in fp8rl's own layout
        (``_paged_kv``), independent of the ISA-specific layout vLLM's kernels use (AMX packs
        keys differently from the vector kernels); else vLLM's ``cpu_attn_reshape_and_cache``."""
        if not self.fp8rl_active:
            return super().do_kv_cache_update(layer, key, value, kv_cache, slot_mapping)
        key_cache, value_cache = _paged_kv(kv_cache)
        block_size, kv_heads, d = key_cache.shape[2], key_cache.shape[1], key_cache.shape[3]
        slots = slot_mapping[: key.shape[0]].long()
        keep = slots >= 0  # padded slots are -1
        slots = slots[keep]
        blocks, offsets = slots // block_size, slots % block_size
        key_cache[blocks, :, offsets] = key.reshape(-1, kv_heads, d)[keep].to(key_cache.dtype)
        value_cache[blocks, :, offsets] = value.reshape(-1, kv_heads, d)[keep].to(key_cache.dtype)
        return None


def _paged_kv(kv_cache: Tensor) -> tuple[Tensor, Tensor]:
    """Key and value caches [blocks, kv_heads, block_size, D] as views of vLLM's CPU cache tensor
    [blocks, kv_heads, block_size, 2*D]: per block and head, block_size key rows then block_size
    value rows, row-major. Only fp8rl's exact path reads and writes this layout."""
    num_blocks, kv_heads, block_size, width = kv_cache.shape
    raw = kv_cache.view(num_blocks, kv_heads, 2, block_size, width // 2)
    return raw[:, :, 0], raw[:, :, 1]


class FP8RLCPUAttentionBackend(CPUAttentionBackend):
    """vLLM's CPU attention backend with ``FP8RLCPUAttentionImpl``."""

    @staticmethod
    def get_impl_cls() -> type[FP8RLCPUAttentionImpl]:
        return FP8RLCPUAttentionImpl


def register_ops() -> None:
    """Install the subclasses through vLLM's out-of-tree hooks (idempotent, process-wide)."""
    from vllm.v1.attention.backends.registry import AttentionBackendEnum, register_backend

    for base, ours in (
        (RMSNorm, FP8RLRMSNorm),
        (SiluAndMul, FP8RLSiluAndMul),
        (RotaryEmbedding, FP8RLRotaryEmbedding),
    ):
        if base.__name__ not in op_registry_oot:
            base.register_oot(ours, name=base.__name__)
    register_backend(
        AttentionBackendEnum.CPU_ATTN,
        f"{FP8RLCPUAttentionBackend.__module__}.{FP8RLCPUAttentionBackend.__qualname__}",
    )
