"""The one decoder: used by the native trainer, the reference worker and the native rollout engine.

This is how fp8rl makes "the rollout graph is a subgraph of the training graph" true by
construction (Jet-RL §3; DESIGN.md §4): there is no second copy of the model for inference. The
trainer calls ``forward`` over whole (right-padded) sequences; the rollout engine calls the same
``forward`` for prefill and for each decode step with a ``KVCache``. Every linear layer is chosen
per precision mode by ``make_linear`` (FP8 with the shared quantizers, or dense BF16), and every
other op comes from ``fp8rl.kernels.invariant`` with the batch-invariant path when
``precision.exact`` is on. With a KV cache, RoPE and the cache write run as one kernel on CUDA
(``kernels.rope_kv``, bitwise the torch ops the trainer runs), and the attention mask is built
once per forward, not once per layer.

Parameter names follow Hugging Face Llama/Qwen checkpoints (``model.layers.0.self_attn.q_proj``),
so safetensors load without a mapping table.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from fp8rl.kernels.backend import triton_available
from fp8rl.kernels.decode_attention import decode_attention, use_decode_attention
from fp8rl.kernels.dense_cast import GradSum, cast_weight
from fp8rl.kernels.dense_exact import DeferredWeightGrad
from fp8rl.kernels.fused import add_rms_norm_quant, silu_mul_quant
from fp8rl.kernels.gemm import fp8_gemm
from fp8rl.kernels.invariant import (
    apply_rope,
    attention,
    attention_mask,
    dense_linear,
    rms_norm,
    rope_table,
    silu_mul,
    triton_attention,
    visible_keys,
)
from fp8rl.kernels.kv import (
    check_kv_scale,
    kv_round_trip,
    kv_scale_from_amax,
)
from fp8rl.kernels.linear_group import grouped_fp8_linear
from fp8rl.kernels.quant import QuantizedTensor
from fp8rl.kernels.rope_kv import rope_kv_write
from fp8rl.workers.model.config import DecoderConfig
from fp8rl.workers.model.fusion import fuse_quantized_linears, still_fused
from fp8rl.workers.model.linear import DenseLinear, LayerPrecision, make_linear
from fp8rl.workers.model.recompute import recomputed
from fp8rl.workers.model.tied_grad import defers_head_grad, tied_embedding


@dataclass
class KVCache:
    """Per-layer key/value storage, indexed by position: k[l], v[l] are [B, Hkv, capacity, D]."""

    k: list[Tensor]
    v: list[Tensor]

    @classmethod
    def allocate(
        cls,
        config: DecoderConfig,
        *,
        batch: int,
        capacity: int,
        dtype: torch.dtype,
        device: torch.device | str,
        kv_fp8: bool = False,
    ) -> KVCache:
        """Zero-filled cache for ``batch`` sequences of up to ``capacity`` positions
        (FP8 E4M3 storage when ``kv_fp8``: half the memory of BF16)."""
        shape = (batch, config.num_key_value_heads, capacity, config.head_dim)
        if kv_fp8:
            dtype = torch.float8_e4m3fn
        layers = range(config.num_hidden_layers)
        return cls(
            [torch.zeros(shape, dtype=dtype, device=device) for _ in layers],
            [torch.zeros(shape, dtype=dtype, device=device) for _ in layers],
        )

    @property
    def capacity(self) -> int:
        """Positions each sequence can hold."""
        return self.k[0].shape[2]

    def select(self, index: Tensor, out: KVCache | None = None) -> KVCache:
        """A cache holding only the sequences ``index`` (e.g. to replicate a prefill n times);
        written into ``out``'s tensors in place when given (``len(index)`` rows, this capacity).
        """
        if out is None:
            return KVCache([_rows(k, index) for k in self.k], [_rows(v, index) for v in self.v])
        want = (len(index), *self.k[0].shape[1:])
        if any(
            t.shape != want or t.dtype != self.k[0].dtype or t.device != self.k[0].device
            for t in out.k + out.v
        ):
            raise ValueError(f"select(out=) needs {want} {self.k[0].dtype} tensors, got others")
        for src, dst in zip(self.k + self.v, out.k + out.v, strict=True):
            _rows(src, index, dst)
        return out


class RMSNorm(nn.Module):
    """RMSNorm with a learned gain (see ``fp8rl.kernels.invariant.rms_norm``)."""

    def __init__(self, dim: int, eps: float, *, exact: bool) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps, self.exact = eps, exact

    def forward(self, x: Tensor) -> Tensor:
        return recomputed(rms_norm, x, self.weight, self.eps, exact=self.exact)


class Attention(nn.Module):
    """GQA self-attention with RoPE, optional q/k biases (Qwen2.5) and q/k RMSNorm (Qwen3)."""

    def __init__(self, config: DecoderConfig, prefix: str, precision: LayerPrecision) -> None:
        super().__init__()
        c, h, d = config, config.hidden_size, config.head_dim
        self.heads, self.kv_heads, self.head_dim = c.num_attention_heads, c.num_key_value_heads, d
        self.exact = precision.exact
        bias = c.attention_bias
        self.q_proj = make_linear(f"{prefix}.q_proj", h, self.heads * d, bias, precision)
        self.k_proj = make_linear(f"{prefix}.k_proj", h, self.kv_heads * d, bias, precision)
        self.v_proj = make_linear(f"{prefix}.v_proj", h, self.kv_heads * d, bias, precision)
        self.o_proj = make_linear(f"{prefix}.o_proj", self.heads * d, h, False, precision)
        if c.qk_norm:
            self.q_norm = RMSNorm(d, c.rms_norm_eps, exact=self.exact)
            self.k_norm = RMSNorm(d, c.rms_norm_eps, exact=self.exact)
        else:
            self.q_norm = self.k_norm = None
        self.kv_fp8 = precision.kv_fp8
        if self.kv_fp8:  # per-tensor scales, 0 = not calibrated (refused in forward)
            self.register_buffer("k_scale", torch.zeros((), dtype=torch.float32))
            self.register_buffer("v_scale", torch.zeros((), dtype=torch.float32))
            self.register_buffer("kv_amax", torch.zeros(2, dtype=torch.float32), persistent=False)
            self.observe_kv = False
        self.fused_qkv = None  # set by fuse(): q/k/v codes as one [ΣN, K] FP8 weight

    def projections(self) -> list[nn.Module]:
        """q, k, v projections, in the order of the fused weight."""
        return [self.q_proj, self.k_proj, self.v_proj]

    def fuse(self) -> None:
        """Fuse the q/k/v FP8 weights (inference modules only; a no-op otherwise)."""
        self.fused_qkv = fuse_quantized_linears(self.projections())

    def forward(
        self,
        x: Tensor,
        cos: Tensor,
        sin: Tensor,
        positions: Tensor,
        k_len: Tensor,
        cache: tuple[Tensor, Tensor] | None,
        mask: Tensor | None = None,
    ) -> Tensor:
        b, length, _ = x.shape
        q, k, v = grouped_fp8_linear(x, self.projections())  # one FP8 GEMM where groupable
        q = q.view(b, length, self.heads, self.head_dim)
        k = k.view(b, length, self.kv_heads, self.head_dim)
        v = v.view(b, length, self.kv_heads, self.head_dim)
        return self._attend(q, k, v, cos, sin, positions, k_len, cache, mask)

    def forward_quantized(
        self,
        xq: QuantizedTensor,
        dtype: torch.dtype,
        cos: Tensor,
        sin: Tensor,
        positions: Tensor,
        k_len: Tensor,
        cache: tuple[Tensor, Tensor] | None,
        mask: Tensor | None = None,
    ) -> Tensor:
        """``forward`` from the 1×128 codes of the normed input, through the fused q/k/v GEMM."""
        b, length, _ = xq.shape
        qkv = fp8_gemm(xq, self.fused_qkv, out_dtype=dtype, exact=self.exact)
        if self.q_proj.bias is not None:
            qkv = qkv + torch.cat([p.bias for p in self.projections()]).to(dtype)
        nq, nk = self.heads * self.head_dim, self.kv_heads * self.head_dim
        q = qkv[..., :nq].view(b, length, self.heads, self.head_dim)
        k = qkv[..., nq : nq + nk].view(b, length, self.kv_heads, self.head_dim)
        v = qkv[..., nq + nk :].view(b, length, self.kv_heads, self.head_dim)
        return self._attend(q, k, v, cos, sin, positions, k_len, cache, mask)

    def _attend(self, q, k, v, cos, sin, positions, k_len, cache, mask=None) -> Tensor:
        """RoPE, KV cache, attention and o_proj. q/k/v: [B, L, heads, D] → [B, L, hidden].
        ``mask``: ``attention_mask(positions, k_len, keys)`` or ``visible_keys(positions,
        k_len)`` when the caller built it once for every layer (built here otherwise)."""
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        if cache is not None:
            q = self._rope_and_store(q, k, v, cos, sin, positions, cache)
            return self._attend_cache(q, cache, positions, k_len, mask)
        q = apply_rope(q.transpose(1, 2), cos, sin)
        k = apply_rope(k.transpose(1, 2), cos, sin)
        v = v.transpose(1, 2)
        if self.kv_fp8:  # the cache's round trip, gradients straight through
            self._check_and_observe(k, v)
            k = kv_round_trip(k, self.k_scale, q.dtype)
            v = kv_round_trip(v, self.v_scale, q.dtype)
        return self._attention(q, k, v, positions, k_len, mask)

    def _rope_and_store(self, q, k, v, cos, sin, positions, cache) -> Tensor:
        """Rotated queries [B, H, L, D]; rotated keys and the values stored (FP8-coded with an
        FP8 cache) at their positions: one fused kernel on CUDA (``kernels.rope_kv``)."""
        scales = (None, None)
        if self.kv_fp8:
            if self.observe_kv:  # calibration records the rotated keys' amax
                self._check_and_observe(apply_rope(k.transpose(1, 2), cos, sin), v)
            else:
                self._check_and_observe(k, v)
            scales = (self.k_scale, self.v_scale)
        return rope_kv_write(q, k, v, cos, sin, positions, *cache, *scales)

    def _attend_cache(self, q, cache, positions, k_len, mask) -> Tensor:
        """Attention of rotated queries [B, H, L, D] over the cache, then o_proj."""
        k_cache, v_cache = cache
        scales = (self.k_scale, self.v_scale) if self.kv_fp8 else (None, None)
        if use_decode_attention(q, self.kv_heads, exact=self.exact):  # opt-in split-KV kernel
            b, _, length, _ = q.shape
            out = decode_attention(
                q, k_cache, v_cache, positions, k_len, scale=self.head_dim**-0.5,
                k_scale=scales[0], v_scale=scales[1],
            )  # fmt: skip
            return self.o_proj(out.transpose(1, 2).reshape(b, length, -1))
        return self._attention(q, k_cache, v_cache, positions, k_len, mask, *scales)

    def _attention(self, q, k, v, positions, k_len, mask, k_scale=None, v_scale=None) -> Tensor:
        """Masked attention of q [B, H, L, D] over k/v [B, Hkv, Lk, D] (FP8 cache codes with
        their scales: read in place or dequantized, ``invariant.attention``), then o_proj."""
        b, _, length, _ = q.shape
        out = recomputed(
            attention, q, k, v, mask, scale=self.head_dim**-0.5, exact=self.exact,
            q_pos=positions, k_len=k_len, k_scale=k_scale, v_scale=v_scale,
        )  # fmt: skip
        return self.o_proj(out.transpose(1, 2).reshape(b, length, self.heads * self.head_dim))

    def _check_and_observe(self, k: Tensor, v: Tensor) -> None:
        """Refuse uncalibrated scales; record k/v amax while calibrating (``observe_kv``)."""
        if self.observe_kv:
            with torch.no_grad():
                seen = torch.stack(
                    [k.detach().abs().amax().float(), v.detach().abs().amax().float()]
                )
                self.kv_amax.copy_(torch.maximum(self.kv_amax, seen))
        if not capturing():
            check_kv_scale(self.k_scale, "k_scale")
            check_kv_scale(self.v_scale, "v_scale")

    def recalibrate_kv(self) -> None:
        """Set k/v scales from the amax observed since the last call (trainer only)."""
        with torch.no_grad():
            if float(self.kv_amax.max()) > 0:
                self.k_scale.copy_(kv_scale_from_amax(self.kv_amax[0]))
                self.v_scale.copy_(kv_scale_from_amax(self.kv_amax[1]))
            self.kv_amax.zero_()


HALF_DTYPES = (torch.bfloat16, torch.float16)
"""Compute dtypes whose exact-mode ops run Triton on CUDA (``invariant.triton_exact``)."""


def capturing() -> bool:
    """True while a CUDA graph is being captured (host-side checks must be skipped then)."""
    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()


def _rows(cache: Tensor, index: Tensor, out: Tensor | None = None) -> Tensor:
    if cache.dtype == torch.float8_e4m3fn:  # no FP8 index_select on CPU: move bytes
        dst = None if out is None else out.view(torch.uint8)
        return torch.index_select(cache.view(torch.uint8), 0, index, out=dst).view(cache.dtype)
    return torch.index_select(cache, 0, index, out=out)


class MLP(nn.Module):
    """SwiGLU feed-forward: down(silu(gate(x)) * up(x))."""

    def __init__(self, config: DecoderConfig, prefix: str, precision: LayerPrecision) -> None:
        super().__init__()
        h, i = config.hidden_size, config.intermediate_size
        self.gate_proj = make_linear(f"{prefix}.gate_proj", h, i, False, precision)
        self.up_proj = make_linear(f"{prefix}.up_proj", h, i, False, precision)
        self.down_proj = make_linear(f"{prefix}.down_proj", i, h, False, precision)
        self.exact = precision.exact

        self.fused_gate_up = None  # set by fuse(): gate/up codes as one [2I, K] FP8 weight

    def forward(self, x: Tensor) -> Tensor:
        gate, up = grouped_fp8_linear(x, [self.gate_proj, self.up_proj])
        act = recomputed(silu_mul, gate, up, exact=self.exact)
        return self.down_proj(act)

    def fuse(self) -> None:
        """Fuse the gate/up FP8 weights (inference modules only; a no-op otherwise)."""
        self.fused_gate_up = fuse_quantized_linears([self.gate_proj, self.up_proj])

    def forward_quantized(self, xq: QuantizedTensor, dtype: torch.dtype) -> Tensor:
        """``forward`` from the 1×128 codes of the normed input: fused gate/up GEMM, then
        SiLU·mul fused with down_proj's 1×128 quantization."""
        gate_up = fp8_gemm(xq, self.fused_gate_up, out_dtype=dtype, exact=self.exact)
        inter = self.gate_proj.out_features
        act = silu_mul_quant(
            gate_up[..., :inter],
            gate_up[..., inter:],
            scale_format=self.down_proj.scale_format,
            check_finite=self.down_proj.check_finite,
        )
        return fp8_gemm(act, self.down_proj.quantized_weight(), out_dtype=dtype, exact=self.exact)


class Block(nn.Module):
    """Pre-norm decoder block: x + attn(norm(x)), then x + mlp(norm(x))."""

    def __init__(self, config: DecoderConfig, index: int, precision: LayerPrecision) -> None:
        super().__init__()
        prefix = f"model.layers.{index}"
        layer_precision = precision.for_block(index, config.num_hidden_layers)
        eps, exact = config.rms_norm_eps, precision.exact
        self.input_layernorm = RMSNorm(config.hidden_size, eps, exact=exact)
        self.self_attn = Attention(config, f"{prefix}.self_attn", layer_precision)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, eps, exact=exact)
        self.mlp = MLP(config, f"{prefix}.mlp", layer_precision)
        self.compute_dtype = precision.dtype

    def forward(
        self,
        x: Tensor,
        cos: Tensor,
        sin: Tensor,
        positions: Tensor,
        k_len: Tensor,
        cache: tuple[Tensor, Tensor] | None = None,
        mask: Tensor | None = None,
    ) -> Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, positions, k_len, cache, mask)
        return x + self.mlp(self.post_attention_layernorm(x))

    def fused_ready(self) -> bool:
        """True when the fused inference path may run: no autograd, fused FP8 weights still
        backing the projections (``fuse_quantized_linears``). Exact mode too: the fused
        norm/SwiGLU-quant kernels are the Triton arithmetic of the trainer's RMSNorm / SiLU·mul
        and quantizer, row by row, and its GEMMs run ``exact`` (N-concatenated weights change
        no column's sum: tiles are aligned to the 128-row blocks). Not exact mode off CUDA or in
        float32, whose norm and SiLU are float64 (``invariant.triton_exact``)."""
        attn, mlp = self.self_attn, self.mlp
        codes = getattr(mlp.down_proj, "weight_codes", None)
        return (
            not torch.is_grad_enabled()
            and codes is not None
            and (not mlp.exact or self._exact_on_triton(codes))
            and getattr(attn.o_proj, "weight_codes", None) is not None
            and still_fused(attn.fused_qkv, attn.projections())
            and still_fused(mlp.fused_gate_up, [mlp.gate_proj, mlp.up_proj])
        )

    def _exact_on_triton(self, codes: Tensor) -> bool:
        """Exact mode's norm/SiLU run the fused kernels' Triton arithmetic: CUDA, BF16/FP16."""
        return codes.is_cuda and triton_available() and self.compute_dtype in HALF_DTYPES

    def forward_fused(
        self,
        x: Tensor,
        delta: Tensor | None,
        cos: Tensor,
        sin: Tensor,
        positions: Tensor,
        k_len: Tensor,
        cache: tuple[Tensor, Tensor] | None = None,
        mask: Tensor | None = None,
    ) -> tuple[Tensor, Tensor]:
        """The fast inference block on ``x + delta`` (delta: the previous block's MLP output,
        added inside the fused norm). Returns ``(residual, mlp_out)``: the block's output is
        their sum, left to the next block's fused norm (or the caller) to add."""
        attn, mlp = self.self_attn, self.mlp
        fmt, check = mlp.down_proj.scale_format, mlp.down_proj.check_finite
        norm1, norm2 = self.input_layernorm, self.post_attention_layernorm
        x, xq = add_rms_norm_quant(
            x, delta, norm1.weight, norm1.eps, scale_format=fmt, check_finite=check
        )
        attn_out = attn.forward_quantized(xq, x.dtype, cos, sin, positions, k_len, cache, mask)
        x, hq = add_rms_norm_quant(
            x, attn_out, norm2.weight, norm2.eps, scale_format=fmt, check_finite=check
        )
        return x, mlp.forward_quantized(hq, x.dtype)


class _Backbone(nn.Module):
    def __init__(self, config: DecoderConfig, precision: LayerPrecision) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        nn.init.normal_(self.embed_tokens.weight, std=0.02)  # HF initializer_range (random presets)
        self.layers = nn.ModuleList(
            Block(config, i, precision) for i in range(config.num_hidden_layers)
        )
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps, exact=precision.exact)


class Decoder(nn.Module):
    """Llama 3.x / Qwen2.5 / Qwen3 decoder with precision-selected linear layers.

    Args:
        config: architecture.
        precision: compute dtype, FP8 or dense linears, BF16-kept modules, exact mode, and whether
            linear layers hold trainable master weights or inference-only FP8 codes.
        max_positions: length of the RoPE table (prompt + response).
    """

    def __init__(
        self, config: DecoderConfig, precision: LayerPrecision, *, max_positions: int
    ) -> None:
        super().__init__()
        self.config, self.precision = config, precision
        self.model = _Backbone(config, precision)
        if not config.tie_word_embeddings:
            self.lm_head = make_linear(
                "lm_head", config.hidden_size, config.vocab_size, False, precision
            )
        cos, sin = rope_table(config.head_dim, max_positions, config.inv_freq())
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)
        self.gradient_checkpointing = False

    @property
    def compute_dtype(self) -> torch.dtype:
        """Dtype of activations (BF16 or FP32)."""
        return self.precision.dtype

    def forward(
        self,
        input_ids: Tensor,
        positions: Tensor,
        k_len: Tensor,
        cache: KVCache | None = None,
        kv_limit: int | None = None,
        tied_head: DeferredWeightGrad | None = None,
    ) -> Tensor:
        """Final hidden states [B, L, H] (compute dtype) for tokens at the given positions.

        Args:
            input_ids: [B, L] int64 (right-padded when lengths differ).
            positions: [B, L] int64 position of each token (key index in the cache).
            k_len: [B] number of valid keys per sequence (its length so far, this chunk included).
            cache: KV cache written at ``positions`` and attended over; None = keys are this chunk.
            kv_limit: attend over the first ``kv_limit`` cache positions only (all positions and
                keys of the step must lie below it); saves reading the unused cache tail.
            tied_head: the tied head's deferred ∇W, which the embedding's backward sums
                (``tied_grad``; ``score_responses`` passes it to both).
        """
        if not capturing() and int(positions.max()) >= self.rope_cos.shape[0]:
            raise ValueError(
                f"position {int(positions.max())} exceeds max_positions {self.rope_cos.shape[0]}"
            )
        weight = self.model.embed_tokens.weight
        if tied_head is None:
            x = F.embedding(input_ids, weight).to(self.compute_dtype)
        else:
            x = tied_embedding(input_ids, weight, tied_head).to(self.compute_dtype)
        cos, sin = self.rope_cos[positions], self.rope_sin[positions]
        limit = None if cache is None else min(kv_limit or cache.capacity, cache.capacity)
        if triton_attention(x, exact=self.precision.exact, head_dim=self.config.head_dim):
            mask = visible_keys(positions, k_len)  # the Triton attention's form, once per forward
        else:
            mask = attention_mask(positions, k_len, input_ids.shape[1] if limit is None else limit)
        pending = None  # the last fused block's MLP output, not yet added to x
        for i, layer in enumerate(self.model.layers):
            kv = None if cache is None else (cache.k[i][:, :, :limit], cache.v[i][:, :, :limit])
            if layer.fused_ready():
                x, pending = layer.forward_fused(x, pending, cos, sin, positions, k_len, kv, mask)
                continue
            if pending is not None:
                x, pending = x + pending, None
            if self.gradient_checkpointing and self.training and cache is None:
                x = checkpoint(
                    layer, x, cos, sin, positions, k_len, None, mask, use_reentrant=False
                )
            else:
                x = layer(x, cos, sin, positions, k_len, kv, mask)
        if pending is not None:
            x = x + pending
        return self.model.norm(x)

    def fuse_projections(self) -> None:
        """Fuse q/k/v and gate/up FP8 weights of inference blocks for the fused inference path
        (no-op for trainable or dense models). Call after the weights are frozen and placed."""
        for layer in self.model.layers:
            layer.self_attn.fuse()
            layer.mlp.fuse()

    def logits(self, hidden: Tensor, tied_head: DeferredWeightGrad | None = None) -> Tensor:
        """Vocabulary logits [..., V] in the compute dtype from hidden states [..., H]
        (``tied_head``: defer a tied head's ∇W to the embedding's backward, see ``forward``)."""
        if self.config.tie_word_embeddings:
            weight, exact = self.model.embed_tokens.weight, self.precision.exact
            return dense_linear(hidden, weight, exact=exact, deferred=tied_head)
        return self.lm_head(hidden)

    def head(
        self, tied_head: DeferredWeightGrad | None = None
    ) -> tuple[Callable[[Tensor], Tensor], GradSum | None]:
        """``logits`` as the function ``chunked_logprobs`` calls per chunk of one scoring pass,
        and the ``GradSum`` to pass it along (or None).

        A dense head whose master weight is not in the compute dtype (the trainer's FP32 master)
        is cast once here, for every chunk and every chunk's recompute in the backward, instead
        of once per call (``kernels.dense_cast``: the same logits bitwise). The copy lives as long
        as the pass's autograd graph. Its ∇W is summed over the chunks in one FP32 buffer
        (``GradSum``), which ``chunked_logprobs`` hands to the weight once: on CUDA inside the
        GEMMs (more accurate than per-chunk BF16 ∇W, not bitwise it), on CPU bitwise as before. ``hidden [n, H] → logits [n, V]``; hidden in another dtype
        than the compute dtype is cast per call, as ``logits`` does. With a cast the function
        calls ``dense_linear`` directly: hooks on ``lm_head`` do not run (none of fp8rl's models
        with an FP32 master head has any).
        """
        tied = self.config.tie_word_embeddings
        weight = self.model.embed_tokens.weight if tied else getattr(self.lm_head, "weight", None)
        dense = tied or isinstance(self.lm_head, DenseLinear)
        on_cpu_exact = self.precision.exact and weight is not None and not weight.is_cuda
        cast = None
        if dense and not on_cpu_exact:  # CPU exact heads run float64 GEMMs: nothing to reuse
            cast = cast_weight(weight, self.compute_dtype)
        if cast is None:
            return partial(self.logits, tied_head=tied_head), None
        bias = None if tied else self.lm_head.bias
        summed = weight.requires_grad and torch.is_grad_enabled()
        grad_sum = GradSum(weight) if summed else None
        fn = partial(
            dense_linear, weight=weight, bias=bias, exact=self.precision.exact,
            deferred=tied_head, cast=cast, grad_sum=grad_sum,
        )  # fmt: skip
        return fn, grad_sum

    def score_responses(
        self,
        input_ids: Tensor,
        positions: Tensor,
        lengths: Tensor,
        prompt_lengths: Tensor,
        response_ids: Tensor,
        *,
        temperature: float,
        with_entropy: bool,
    ) -> tuple[Tensor, Tensor | None]:
        """Logprobs (and entropy) [B, R] float32 of right-padded response tokens, in one call.

        The whole policy pass (decoder, response gather, chunked lm_head + log-softmax) runs
        inside this method, so a sharded trainer registers it as an FSDP forward method and the
        root's parameters (embeddings, final norm, lm_head) are gathered once around it.

        Args:
            input_ids, positions: [B, L] int64 prompt+response (``PackedBatch``).
            lengths, prompt_lengths: [B] int64. response_ids: [B, R] int64.
            temperature: sampling temperature. with_entropy: also return the entropy.
        Returns:
            (logp [B, R], entropy [B, R] or None), unmasked (callers mask padding).
        """
        from fp8rl.workers.model.logprob import chunked_logprobs

        tied = None
        if self.config.tie_word_embeddings and defers_head_grad(
            self.model.embed_tokens.weight, exact=self.precision.exact
        ):
            tied = DeferredWeightGrad()  # the head's ∇W, summed in the embedding's backward
        hidden = self.forward(input_ids, positions, lengths, tied_head=tied)
        r = response_ids.shape[1]
        idx = prompt_lengths[:, None] - 1 + torch.arange(r, device=hidden.device)[None]
        idx = idx.clamp(max=hidden.shape[1] - 1)
        hidden = hidden.gather(1, idx[..., None].expand(-1, -1, hidden.shape[-1]))
        head, grad_sum = self.head(tied)
        return chunked_logprobs(
            head,
            hidden,
            response_ids,
            temperature=temperature,
            exact=self.precision.exact,
            with_entropy=with_entropy,
            grad_sum=grad_sum,
        )

    def token_logprobs(self, hidden: Tensor, tokens: Tensor, *, temperature: float) -> Tensor:
        """log p(tokens) [...] (float32) under softmax(logits/temperature), from hidden [..., H].

        The rollout engine and the trainer both score tokens through this method.
        """
        from fp8rl.workers.model.logprob import chunked_logprobs

        head, grad_sum = self.head()
        logp, _ = chunked_logprobs(
            head, hidden, tokens, temperature=temperature, exact=self.precision.exact,
            grad_sum=grad_sum,
        )  # fmt: skip
        return logp
