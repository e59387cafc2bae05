"""Token logprobs (and entropy) from hidden states in chunks of tokens: lm_head + log_softmax.

The tail of a policy forward (lm_head GEMM, log-softmax, entropy) unchunked materialises the
[tokens, V] logits and, on the torch paths (CPU; CUDA with ``set_fast_logprobs("torch")``),
float32/float64 copies of them: about 31 bytes per token × vocabulary entry, 61-72 GiB at 16K
tokens and a 128K vocabulary.
``chunked_logprobs`` runs it ``chunk`` tokens at a time and, when gradients are needed, recomputes
each chunk's logits in the backward (activation checkpointing), so only [chunk, V] is live.

Every row is computed by the same per-row ops as the unchunked composition
``token_logprobs(logits(hidden))``, so the result is bitwise equal to it wherever the lm_head GEMM
is batch-invariant (always in exact mode).

On CUDA the log-softmax (and the entropy, in the same pass) are the Triton rows of
``kernels.logprob_triton``: the BF16 logits are read, never copied to float32. The decoder's
``head()`` casts an FP32 master head to BF16 once for all chunks and recomputes, and sums its ∇W
over the chunks in one FP32 buffer (``kernels.dense_cast.GradSum``; on CPU only in fast mode).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import torch
from torch import Tensor
from torch.utils.checkpoint import checkpoint

from fp8rl.kernels.dense_cast import GradSum
from fp8rl.kernels.invariant import token_logprobs, triton_logprobs
from fp8rl.workers.algorithms import entropy_from_logits

CHUNK_TOKENS = 2048
"""Tokens per lm_head + log-softmax chunk."""


def chunked_logprobs(
    logits_fn: Callable[[Tensor], Tensor],
    hidden: Tensor,
    tokens: Tensor,
    *,
    temperature: float,
    exact: bool,
    with_entropy: bool = False,
    chunk: int = CHUNK_TOKENS,
    grad_sum: GradSum | None = None,
) -> tuple[Tensor, Tensor | None]:
    """log p(tokens) and optionally the entropy of softmax(logits / T), ``chunk`` tokens at a time.

    Args:
        logits_fn: hidden [n, H] → logits [n, V] (the model's lm_head: ``Decoder.head()``, or
            ``Decoder.logits``).
        hidden: [..., H] hidden states in the compute dtype.
        tokens: [...] int64 token ids (same leading shape as ``hidden``).
        temperature: sampling temperature (<= 0: greedy, scored at T = 1).
        exact: batch-invariant log-softmax (``kernels.invariant.token_logprobs``: float64 on
            CPU, the Triton rows on CUDA).
        with_entropy: also return the per-token entropy (nats).
        chunk: tokens per chunk (> 0).
        grad_sum: the head's ∇W summed over the chunks (``Decoder.head()``'s second value):
            the chunks' hidden states pass through its ``collect`` so the sum reaches the weight.
    Returns:
        (logp [...] float32, entropy [...] float32 or None).
    Raises:
        ValueError: ``chunk`` is not positive or the shapes disagree.
    """
    if chunk <= 0:
        raise ValueError(f"chunk must be positive, got {chunk}")
    if hidden.shape[:-1] != tokens.shape:
        raise ValueError(
            f"hidden {tuple(hidden.shape)} does not match tokens {tuple(tokens.shape)}"
        )
    flat_h, flat_t = hidden.reshape(-1, hidden.shape[-1]), tokens.reshape(-1)
    if grad_sum is not None:
        flat_h = grad_sum.collect(flat_h)
    step = partial(
        _chunk, logits_fn, temperature=temperature, exact=exact, with_entropy=with_entropy
    )
    recompute = torch.is_grad_enabled() and flat_h.requires_grad  # after collect: a trainable head
    logps, entropies = [], []
    for start in range(0, max(flat_t.shape[0], 1), chunk):
        args = (flat_h[start : start + chunk], flat_t[start : start + chunk])
        logp, entropy = checkpoint(step, *args, use_reentrant=False) if recompute else step(*args)
        logps.append(logp)
        entropies.append(entropy)
    # fresh tensors, not views: FSDP hooks the outputs of a sharded model's forward method
    logp = torch.cat(logps).reshape(tokens.shape).clone()
    entropy = torch.cat(entropies).reshape(tokens.shape).clone() if with_entropy else None
    return logp, entropy


def _chunk(
    logits_fn: Callable[[Tensor], Tensor],
    hidden: Tensor,
    tokens: Tensor,
    *,
    temperature: float,
    exact: bool,
    with_entropy: bool,
) -> tuple[Tensor, Tensor | None]:
    logits = logits_fn(hidden)
    if with_entropy and triton_logprobs(logits, exact=exact):  # one pass over each row
        from fp8rl.kernels.logprob_triton import token_logprobs_entropy

        return token_logprobs_entropy(logits, tokens, temperature=_scored(temperature))
    logp = token_logprobs(logits, tokens, temperature=temperature, exact=exact)
    if not with_entropy:
        return logp, None
    scaled = logits if temperature <= 0 else logits.float() / temperature
    return logp, entropy_from_logits(scaled)


def _scored(temperature: float) -> float:
    """The temperature a row is scored at (greedy, T ≤ 0, scores the T = 1 softmax)."""
    return temperature if temperature > 0 else 1.0
