"""Parity-safe ops: the non-GEMM math of the shared decoder, with a batch-invariant ``exact`` path.

Bitwise parity between the rollout engine (prefill + KV-cache decode, any batch) and the trainer
(one forward over whole sequences) needs every op on the shared path to compute a token's row
with arithmetic that does not depend on how many other rows are in the batch, on the row's
position in the batch, or on how many (masked) keys follow it. BLAS kernels and reductions pick
their blocking from the shape, so in ``exact`` mode every order-sensitive reduction here is done
in float64 and the result rounded once to the model's compute dtype (BF16 activations, BF16
logits): the float64 results of two summation orders differ by a few float64 ulps, far below one
BF16 ulp, so the rounded values agree except when a float64 value falls within ~1e-16 (relative)
of a BF16 rounding boundary (≈1e-13 per element). The FP8 GEMMs themselves are exact by
construction (``fp8rl.kernels`` emulation: per-128 K-block partials are exact in float64).

Elementwise ops (residual adds, RoPE with a precomputed table, SiLU in float64) are bitwise
deterministic per element. Masked attention keys contribute exact zeros, so a decode step over a
KV cache of any capacity equals the trainer's causal row.

On CUDA (BF16/FP16 activations) exact attention, the dense (vocabulary) head and the token
log-softmax run batch-invariant Triton kernels, and RMSNorm / SiLU·mul the fast path's Triton
kernels (one program per row; elementwise) with fp32 accumulation instead of float64
(``attention_exact_triton``, ``dense_exact_triton``, ``logprob_triton``; their docstrings give
the invariance argument): a row's bits still depend only on that row, so the engine (prefill, decode over any
cache) and the trainer agree bitwise on the GPU, as the float64 paths make them agree on CPU.
GPU and CPU results are not bitwise equal to each other.

The fast (``exact=False``) paths use the usual fused kernels (BF16 GEMM, fp32 softmax; on CUDA
the token log-softmax is exact mode's Triton rows, ``set_fast_logprobs``) and are the ones to use
on GPU for speed. Their attention on CUDA is exact mode's invariant Triton kernel
by default (``set_fast_attention``; SDPA before 2026-12-04, and off CUDA). Their RMSNorm and SiLU·mul are ``fused.rms_norm_fast`` /
``silu_mul_fast``: on CUDA the Triton arithmetic of the rollout engine's fused norm/SwiGLU-quant
kernels, so the trainer's FP8 FProp input has the codes the engine computed.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from fp8rl.kernels.backend import triton_available
from fp8rl.kernels.dense_cast import GradSum, cast_linear
from fp8rl.kernels.dense_exact import MIN_ELEMENTS, DeferredWeightGrad, exact_dense_linear
from fp8rl.kernels.fused import rms_norm_fast, silu_mul_fast
from fp8rl.kernels.kv import kv_dequantize
from fp8rl.kernels.quant import FP8_DTYPE


def rms_norm(x: Tensor, weight: Tensor, eps: float, *, exact: bool = False) -> Tensor:
    """RMSNorm (Zhang & Sennrich 2019; Llama/Qwen convention: normalise in high precision, then
    scale by ``weight``).

    Args:
        x: [..., H] activations in the compute dtype.
        weight: [H] gain (any float dtype; cast to the compute dtype like Hugging Face Llama).
        eps: added to the mean square.
        exact: compute the mean square in float64 (batch-invariant after rounding). Without it,
            and in exact mode on CUDA with BF16/FP16 ``x`` (a whole row per program, float64
            mean square rounded once: the same invariance), ``fused.rms_norm_fast``: on CUDA the values the fused norm-quant kernel of the
            rollout engine quantizes, bitwise (the trainer and the engine round alike).
    Returns:
        [..., H] in x.dtype.
    """
    if not exact or triton_exact(x):
        return rms_norm_fast(x, weight, eps)
    h = x.to(torch.float64)
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight.to(x.dtype) * h.to(x.dtype)


def silu_mul(gate: Tensor, up: Tensor, *, exact: bool = False) -> Tensor:
    """SwiGLU's elementwise part ``silu(gate) * up`` ([..., I] → [..., I], dtype of ``gate``).

    ``exact`` evaluates in float64 so vectorised and scalar ``exp`` paths round to the same BF16.
    Without it, and in exact mode on CUDA with BF16/FP16 (one elementwise Triton kernel: the
    same instructions for every element whatever the shape), ``fused.silu_mul_fast``: on CUDA the values the fused SwiGLU-quant kernel of the
    rollout engine quantizes, bitwise.
    """
    if not exact or triton_exact(gate):
        return silu_mul_fast(gate, up)
    return (F.silu(gate.double()) * up.double()).to(gate.dtype)


def rope_table(head_dim: int, max_positions: int, inv_freq: Tensor) -> tuple[Tensor, Tensor]:
    """cos/sin tables [max_positions, head_dim] (float32) for rotate-half RoPE (Su et al. 2021).

    Built once per model so prefill, decode and the trainer index the *same* values (recomputing
    cos for one position can round differently from computing it inside a long vector).
    """
    pos = torch.arange(max_positions, dtype=torch.float64)
    freqs = torch.outer(pos, inv_freq.double())
    emb = torch.cat([freqs, freqs], dim=-1)
    return emb.cos().float(), emb.sin().float()


def apply_rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotate-half RoPE. x: [B, heads, L, D]; cos/sin: [B, L, D] float32 rows of ``rope_table``.

    Computed in float32 and rounded once to x.dtype (elementwise, hence batch-invariant).
    """
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    xf = x.float()
    half = xf.shape[-1] // 2
    rotated = torch.cat([-xf[..., half:], xf[..., :half]], dim=-1)
    return (xf * cos + rotated * sin).to(x.dtype)


def attention_mask(q_pos: Tensor, k_len: Tensor, num_keys: int) -> Tensor:
    """Boolean mask [B, 1, Lq, Lk]: key j is visible to a query at position p iff j <= p and j < k_len.

    Keys are stored at index = position (no left padding), which is what makes the trainer's
    causal row and a KV-cache decode step see the same keys at the same indices.
    q_pos: [B, Lq] int64 positions; k_len: [B] valid keys per sequence.
    """
    j = torch.arange(num_keys, device=q_pos.device)
    visible = (j[None, None, :] <= q_pos[:, :, None]) & (j[None, None, :] < k_len[:, None, None])
    return visible[:, None]


def visible_keys(q_pos: Tensor, k_len: Tensor) -> Tensor:
    """[B, Lq] int32: how many keys each query row sees, ``min(position + 1, k_len)`` (the
    prefix ``attention_mask`` marks visible). ``attention`` takes it in place of the mask; the
    decoder builds it once per forward for every layer (four small kernels a layer otherwise).
    q_pos: [B, Lq] integer positions; k_len: [B] integer valid keys per sequence."""
    return torch.minimum(q_pos + 1, k_len[:, None]).to(torch.int32)


def triton_exact(x: Tensor) -> bool:
    """True when the exact ops on ``x`` run the Triton kernels (CUDA, BF16/FP16) instead of
    float64."""
    return x.is_cuda and x.dtype in (torch.bfloat16, torch.float16) and triton_available()


def float64_inside(fn, x: Tensor) -> bool:
    """Whether the exact op ``fn`` on input ``x`` creates float64 intermediates worth recomputing
    in the backward (``recompute.recomputed``); the Triton paths save only BF16 tensors."""
    return not (fn in (attention, rms_norm, silu_mul) and triton_exact(x))


FAST_ATTENTION_KERNELS = ("triton", "triton_decode16", "sdpa")
"""The fast mode's attention choices on CUDA (``set_fast_attention``)."""
_FAST_ATTENTION = ["triton"]
"""The fast mode's attention on CUDA: "triton" (the invariant kernel) or "sdpa" (see
``set_fast_attention``)."""


def set_fast_attention(kernel: str) -> str:
    """Choose the fast (``exact=False``) mode's attention on CUDA, process-wide; returns the
    previous choice.

    "triton" (the default): the invariant Triton flash attention that exact mode runs
    (``attention_exact_triton``). The engine's prefill and every decode step then compute each
    row as the trainer's forward does, bitwise, and an FP8 KV cache is read in place.
    "triton_decode16": the same, with decode calls over a BF16 cache on 16-row tiles
    (``attention_exact_triton`` "Decode tiles": faster, not bitwise the trainer's rows on model
    activations). "sdpa": ``F.scaled_dot_product_attention`` with the mask (the fast path before
    2026-12-04; an FP8 cache is first dequantized whole), kept for A/B benchmarks.

    Raises:
        ValueError: ``kernel`` is not one of ``FAST_ATTENTION_KERNELS``.
    """
    if kernel not in FAST_ATTENTION_KERNELS:
        raise ValueError(f"fast attention kernel {kernel!r} is not one of {FAST_ATTENTION_KERNELS}")
    previous, _FAST_ATTENTION[0] = _FAST_ATTENTION[0], kernel
    return previous


TRITON_HEAD_DIMS = (16, 32, 64, 128, 256)
"""Head sizes the invariant Triton attention takes (fast mode falls back to SDPA for others)."""


def triton_attention(x: Tensor, *, exact: bool, head_dim: int | None = None) -> bool:
    """Whether ``attention`` on queries like ``x`` (head size ``head_dim``, default
    ``x.shape[-1]``) runs the invariant Triton kernel (then it reads ``visible_keys`` counts, or
    builds them from ``q_pos``/``k_len``, and reads an FP8 cache in place). Exact mode always does on CUDA in BF16/FP16 (the
    kernel refuses other head sizes with a ValueError)."""
    d = x.shape[-1] if head_dim is None else head_dim
    return triton_exact(x) and (exact or (_FAST_ATTENTION[0] != "sdpa" and d in TRITON_HEAD_DIMS))


def attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Tensor | None,
    *,
    scale: float,
    exact: bool = False,
    q_pos: Tensor | None = None,
    k_len: Tensor | None = None,
    k_scale: Tensor | None = None,
    v_scale: Tensor | None = None,
) -> Tensor:
    """Masked multi-head attention with grouped KV heads (GQA).

    Args:
        q: [B, H, Lq, D] compute dtype.
        k, v: [B, Hkv, Lk, D] with H a multiple of Hkv; compute dtype, or FP8 E4M3 codes of a KV
            cache with ``k_scale``/``v_scale`` (0-d float32; ``kv.kv_dequantize``'s values).
        mask: [B, 1, Lq, Lk] bool, True = visible (every query must see at least one key), or
            the [B, Lq] integer counts of ``visible_keys`` (the same prefix mask, as the Triton
            path reads it); may be None when ``q_pos`` and ``k_len`` are given (the needed form
            is then built here).
        scale: softmax scale (usually D**-0.5).
        exact: batch- and length-invariant everywhere: float64 scores/softmax/PV rounded once
            off CUDA. On CUDA (BF16/FP16) exact mode, and fast mode by default
            (``set_fast_attention``), run the invariant Triton flash attention of
            ``attention_exact_triton`` (it needs the mask to be a prefix per query row, the form
            ``attention_mask`` builds); fast mode elsewhere runs SDPA.
        q_pos, k_len: [B, Lq] positions and [B] key counts the mask is built from
            (``attention_mask``); the Triton path builds ``visible_keys`` from them when ``mask``
            is not already those counts (a bool mask is then not read).
    Returns:
        [B, H, Lq, D] in q.dtype.
    Raises:
        ValueError: neither a mask nor ``q_pos``/``k_len``; a mask neither bool nor [B, Lq]
            integer counts; FP8 k/v without scales.
    """
    counts = mask is not None and mask.dtype != torch.bool
    if mask is not None:
        b, _, lq, _ = q.shape
        want = (b, lq) if counts else (b, 1, lq, k.shape[2])
        if tuple(mask.shape) != want or mask.dtype.is_floating_point or mask.dtype.is_complex:
            raise ValueError(
                f"mask must be bool [B, 1, Lq, Lk] = {(b, 1, lq, k.shape[2])} or integer counts "
                f"[B, Lq] = {(b, lq)} (visible_keys), got {mask.dtype} {tuple(mask.shape)}"
            )
    if triton_attention(q, exact=exact):
        from fp8rl.kernels.attention_exact_triton import exact_attention

        if counts:
            n_visible = mask
        elif q_pos is not None and k_len is not None:
            n_visible = visible_keys(q_pos, k_len)
        elif mask is not None:
            n_visible = mask[:, 0].sum(-1)
        else:
            raise ValueError("attention needs a mask or q_pos and k_len")
        tiles = not exact and _FAST_ATTENTION[0] == "triton_decode16"
        return exact_attention(
            q, k, v, n_visible, scale=scale, k_scale=k_scale, v_scale=v_scale, decode_tiles=tiles
        )
    if k.dtype == FP8_DTYPE:
        if k_scale is None or v_scale is None:
            raise ValueError("FP8 k/v need k_scale and v_scale")
        k, v = kv_dequantize(k, k_scale, q.dtype), kv_dequantize(v, v_scale, q.dtype)
    if counts:  # visible_keys' counts
        mask = (torch.arange(k.shape[2], device=mask.device) < mask[:, :, None])[:, None]
    if mask is None:
        if q_pos is None or k_len is None:
            raise ValueError("attention needs a mask or q_pos and k_len")
        mask = attention_mask(q_pos, k_len, k.shape[2])
    groups = q.shape[1] // k.shape[1]
    if not exact:
        # GQA without copying K/V: fold each KV head's query group into the query axis.
        b, h, lq, d = q.shape
        folded = q.reshape(b, k.shape[1], groups * lq, d)
        fmask = (
            mask.unsqueeze(2)
            .expand(b, 1, groups, lq, mask.shape[-1])
            .reshape(b, 1, groups * lq, -1)
        )
        out = F.scaled_dot_product_attention(folded, k, v, attn_mask=fmask, scale=scale)
        return out.reshape(b, h, lq, d)
    if groups > 1:
        k = k.repeat_interleave(groups, dim=1)
        v = v.repeat_interleave(groups, dim=1)
    scores = torch.matmul(q.double(), k.double().transpose(-1, -2)) * scale
    scores = scores.masked_fill(~mask, float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    return torch.matmul(probs, v.double()).to(q.dtype)


def dense_linear(
    x: Tensor,
    weight: Tensor,
    bias: Tensor | None = None,
    *,
    exact: bool = False,
    deferred: DeferredWeightGrad | None = None,
    cast: Tensor | None = None,
    grad_sum: GradSum | None = None,
) -> Tensor:
    """y = x·Wᵀ + b for layers kept in BF16/FP32 (lm_head, embeddings-tied heads, BF16 mode).

    x: [..., K] compute dtype; weight: [N, K] (cast to x.dtype first, so an FP32 master weight
    computes like its BF16 copy on the rollout side); returns [..., N] in x.dtype. ``exact``
    accumulates in float64 and rounds once (on CUDA with BF16/FP16 ``x``: the batch-invariant
    fp32 Triton GEMM of ``dense_exact_triton``); a weight of ``dense_exact.MIN_ELEMENTS`` or more
    (a vocabulary head) is processed ``dense_exact.ROWS`` rows at a time, forward and backward,
    so its float64 copy and gradient never exist whole. ``deferred`` (a tied head): that blocked
    path keeps ∇W for ``deferred.total`` instead of returning it; the other paths ignore it and
    return ∇W to autograd. ``cast``: ``dense_cast.cast_weight(weight, x.dtype)``, made once for
    several calls (the chunks of one scoring pass): the fast and the Triton exact paths use it
    instead of casting ``weight`` again (same bits, ∇W still to ``weight``); the float64 paths
    ignore it, and so does every path when its dtype is not ``x.dtype`` (then ``weight`` is cast
    for this call, as without it). ``grad_sum`` (``dense_cast.GradSum``): the fast path with
    ``cast`` and the Triton exact path sum ∇W there (``x`` must descend from its ``collect``);
    the float64 paths and the fast path without a usable ``cast`` ignore it (and return ∇W to
    autograd).
    """
    if cast is not None and cast.dtype != x.dtype:
        cast = None
    if exact and triton_exact(x):
        from fp8rl.kernels.dense_exact_triton import exact_dense_gemm

        return exact_dense_gemm(x, weight, bias, cast=cast, grad_sum=grad_sum)
    if exact and weight.numel() >= MIN_ELEMENTS:  # a vocabulary head: no float64 copy of it all
        return exact_dense_linear(x, weight, bias, deferred=deferred)
    if cast is not None and not exact:
        return cast_linear(x, weight, cast, bias, grad_sum=grad_sum)
    w = weight.to(x.dtype)
    b = None if bias is None else bias.to(x.dtype)
    if not exact:
        return F.linear(x, w, b)
    y = F.linear(x.double(), w.double(), None if b is None else b.double())
    return y.to(x.dtype)


FAST_LOGPROBS_KERNELS = ("triton", "torch")
_FAST_LOGPROBS = ["triton"]
"""The fast mode's token log-softmax on CUDA (see ``set_fast_logprobs``)."""


def set_fast_logprobs(kernel: str) -> str:
    """Choose the fast (``exact=False``) mode's ``token_logprobs`` on CUDA, process-wide; returns
    the previous choice.

    "triton" (the default since 2026-12-04): exact mode's row kernels
    (``logprob_triton.exact_token_logprobs``): the forward reads each BF16 logits row once
    and writes one float32 per row, the backward reads the row once and writes ∇logits in the
    logits' dtype (6 bytes per logit for forward and backward, 8 with a checkpointed
    recompute). "torch": the float32 copy of the logits, ``log_softmax`` and ``gather`` (the
    fast path before, ≥ 50 bytes per logit with the recompute), kept for A/B benchmarks.
    Engine and trainer score through the same function, so either keeps their logprobs
    bitwise equal. Exact mode runs the Triton rows whatever this says.

    Raises:
        ValueError: ``kernel`` is not one of ``FAST_LOGPROBS_KERNELS``.
    """
    if kernel not in FAST_LOGPROBS_KERNELS:
        raise ValueError(
            f"fast logprobs kernel must be one of {FAST_LOGPROBS_KERNELS}, got {kernel!r}"
        )
    previous, _FAST_LOGPROBS[0] = _FAST_LOGPROBS[0], kernel
    return previous


def triton_logprobs(logits: Tensor, *, exact: bool) -> bool:
    """Whether ``token_logprobs`` of ``logits`` runs the Triton rows of ``logprob_triton``
    (CUDA with Triton; fast mode unless ``set_fast_logprobs("torch")``)."""
    chosen = exact or _FAST_LOGPROBS[0] == "triton"
    return chosen and logits.is_cuda and triton_available()


def token_logprobs(
    logits: Tensor, tokens: Tensor, *, temperature: float = 1.0, exact: bool = False
) -> Tensor:
    """log p(token) under the full-vocabulary softmax of logits/temperature.

    Not renormalised after top-k/top-p filtering: that is the distribution the trainer scores, so
    importance ratios stay unbiased. temperature <= 0 (greedy) scores the T=1 softmax.

    Args:
        logits: [..., V] (BF16 or FP32). tokens: [...] int64 ids.
        exact: log-softmax in float64 (order-insensitive after rounding to float32). On CUDA
            both modes run the batch-invariant fp32 Triton rows of ``logprob_triton``
            (``triton_logprobs``).
    Returns:
        [...] float32.
    """
    if triton_logprobs(logits, exact=exact):
        from fp8rl.kernels.logprob_triton import exact_token_logprobs

        return exact_token_logprobs(
            logits, tokens, temperature=temperature if temperature > 0 else 1.0
        )
    acc = torch.float64 if exact else torch.float32
    scaled = logits.to(acc)
    if temperature > 0 and temperature != 1.0:
        scaled = scaled / temperature
    logp = torch.log_softmax(scaled, dim=-1)
    return logp.gather(-1, tokens.unsqueeze(-1)).squeeze(-1).float()
