"""Token sampling with temperature, top-k and top-p (pure tensor functions).

Filtering only decides *which* token is drawn. The logprob reported for it is that of the full,
unfiltered softmax of logits/temperature (``kernels.invariant.token_logprobs``), the distribution
the trainer scores: renormalising after top-k/top-p biases importance ratios.

Seeded streams: each sequence has its own 62-bit seed (``sequence_seed`` of the prompt's seed and
the sample's index), and its draw at response position t uses the uniform ``counter_uniforms(seed,
t)`` (a counter-based hash, as in Philox/JAX's stateless PRNG) with inverse-CDF sampling. A
sequence's tokens therefore depend only on its seed and its own logits, not on which engine or
batch it ran in, so results do not change with ``rollout.num_workers``.
"""

from __future__ import annotations

import torch
from torch import Tensor

from fp8rl.kernels.backend import triton_available

SEED_BITS = 62
"""Sequence seeds are below 2**62 (vLLM adds the sample index to a prompt's seed)."""
_MASK32 = 0xFFFFFFFF
_MASK64 = (1 << 64) - 1


def sequence_seed(seed: int, index: int) -> int:
    """A well-mixed seed for stream ``index`` of ``seed`` (splitmix64 of both), below 2**62.

    Used twice: a prompt's seed from the step's sampling seed and the prompt's global index, and a
    sample's seed from its prompt's seed and its index in the group of n.
    """
    x = (seed * 0x9E3779B97F4A7C15 + index + 1) & _MASK64
    for shift, mult in ((30, 0xBF58476D1CE4E5B9), (27, 0x94D049BB133111EB)):
        x = ((x ^ (x >> shift)) * mult) & _MASK64
    return (x ^ (x >> 31)) >> (64 - SEED_BITS)


def _mul32(x: Tensor, c: int) -> Tensor:
    """(x * c) mod 2**32 for int64 x in [0, 2**32) without int64 overflow (16-bit halves)."""
    low = (x & 0xFFFF) * c
    high = (((x >> 16) * c) & 0xFFFF) << 16
    return (low + high) & _MASK32


def _mix32(x: Tensor) -> Tensor:
    """lowbias32 integer hash (C. Wellons) on int64 values in [0, 2**32)."""
    x = x ^ (x >> 16)
    x = _mul32(x, 0x7FEB352D)
    x = x ^ (x >> 15)
    x = _mul32(x, 0x846CA68B)
    return x ^ (x >> 16)


def counter_uniforms(seeds: Tensor, step: int | Tensor) -> Tensor:
    """One uniform in (0, 1) per row from its seed and the counter ``step``.

    seeds: [B] int64 in [0, 2**62); step: an int, or integer steps that broadcast against ``seeds``
    (``[B, 1]`` seeds with ``[T]`` steps give a ``[B, T]`` table) → float64. Pure function of
    (seed, step): the same row gets the same number in any batch, on any device, alone or in a
    table.
    """
    low, high = seeds & _MASK32, (seeds >> 32) & _MASK32
    if isinstance(step, Tensor):
        counter = (step.long() & _MASK32).expand(torch.broadcast_shapes(seeds.shape, step.shape))
    else:
        counter = torch.full_like(seeds, step & _MASK32)
    h = _mix32(low ^ _mix32(high ^ _mix32(counter)))
    h2 = _mix32(h ^ 0x5BD1E995)
    bits = (h >> 6) * (1 << 21) + (h2 >> 11)  # 26 + 21 = 47 random bits
    return (bits.double() + 0.5) / float(1 << 47)


def uniform_table(seeds: Tensor, steps: int) -> Tensor:
    """``counter_uniforms(seeds, t)`` for t = 0 … steps-1 at once: [B] int64 → [B, steps] float64
    (column t bitwise the per-step call; one set of kernels instead of one per step)."""
    return counter_uniforms(seeds[:, None], torch.arange(steps, device=seeds.device))


def filter_logits(logits: Tensor, *, top_k: int = 0, top_p: float = 1.0) -> Tensor:
    """Set logits outside the top-k / top-p nucleus to -inf. logits: [B, V] float32 → [B, V].

    top_k=0 and top_p=1 disable the filters; the most likely token always survives.
    """
    if top_k > 0 and top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
        probs = torch.softmax(sorted_logits, dim=-1)
        beyond = probs.cumsum(-1) - probs > top_p  # mass strictly before this token already > top_p
        beyond[..., 0] = False
        remove = torch.zeros_like(beyond).scatter(-1, order, beyond)
        logits = logits.masked_fill(remove, float("-inf"))
    return logits


def sample_tokens(
    logits: Tensor,
    *,
    temperature: float,
    top_k: int = 0,
    top_p: float = 1.0,
    generator: torch.Generator | None = None,
    seeds: Tensor | None = None,
    step: int = 0,
) -> Tensor:
    """Draw one token per row. logits: [B, V] (any float dtype) → [B] int64.

    temperature <= 0 is greedy (argmax, ties to the lowest id). With ``seeds`` ([B] int64, one
    stream per row) the draw is inverse-CDF sampling at ``counter_uniforms(seeds, step)``: a pure
    function of the row (``draw``); else ``torch.multinomial`` with ``generator``.
    """
    if seeds is not None or temperature <= 0:
        uniforms = None if temperature <= 0 else counter_uniforms(seeds.to(logits.device), step)
        return draw(logits, uniforms, temperature=temperature, top_k=top_k, top_p=top_p)
    scores = filter_logits(logits.float() / temperature, top_k=top_k, top_p=top_p)
    return torch.multinomial(torch.softmax(scores, dim=-1), 1, generator=generator).squeeze(-1)


def draw(
    logits: Tensor,
    uniforms: Tensor | None,
    *,
    temperature: float,
    top_k: int = 0,
    top_p: float = 1.0,
) -> Tensor:
    """The seeded draw: logits [B, V] (any float dtype) and each row's uniform [B] float64 in
    (0, 1) → [B] int64, the token whose CDF interval of softmax(filter(logits/temperature)) holds
    it. temperature <= 0 is greedy (``uniforms`` unused, may be None). No host sync, so a CUDA
    graph can capture it (the engine's decode step). Unfiltered on CUDA: the one-kernel draw of
    ``kernels.sample_triton`` (same distribution; tokens may differ from the torch draw where a
    uniform falls within rounding of a CDF boundary)."""
    scores = logits.float()
    if temperature <= 0:
        return scores.argmax(dim=-1)
    unfiltered = not 0 < top_k < logits.shape[-1] and top_p >= 1.0
    if unfiltered and logits.is_cuda and triton_available():  # one kernel, same distribution
        from fp8rl.kernels.sample_triton import draw_triton

        return draw_triton(logits, uniforms, temperature)
    scores = filter_logits(scores / temperature, top_k=top_k, top_p=top_p)
    return inverse_cdf_sample(torch.softmax(scores, dim=-1), uniforms)


def inverse_cdf_sample(probs: Tensor, uniforms: Tensor) -> Tensor:
    """The token whose CDF interval holds each row's uniform. probs: [B, V] (rows need not be
    normalised), uniforms: [B] in (0, 1) → [B] int64. Zero-probability tokens are never drawn."""
    cdf = probs.double().cumsum(dim=-1)
    target = (uniforms.to(cdf.device) * cdf[:, -1]).unsqueeze(-1)
    return torch.searchsorted(cdf, target).squeeze(-1).clamp_(max=probs.shape[-1] - 1)
