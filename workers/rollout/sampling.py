"""Token sampling with temperature, top-k and top-p (pure tensor functions).

Filtering only decides *which* token is drawn. The logprob reported for it is that of the full,
unfiltered softmax of logits/temperature (``kernels.invariant.token_logprobs``), the distribution
the trainer scores: renormalising after top-k/top-p biases importance ratios.
"""

from __future__ import annotations

import torch
from torch import Tensor


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
) -> Tensor:
    """Draw one token per row. logits: [B, V] (any float dtype) → [B] int64.

    temperature <= 0 is greedy (argmax, ties to the lowest id).
    """
    scores = logits.float()
    if temperature <= 0:
        return scores.argmax(dim=-1)
    scores = filter_logits(scores / temperature, top_k=top_k, top_p=top_p)
    probs = torch.softmax(scores, dim=-1)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)
