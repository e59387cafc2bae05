"""Vocabulary-parallel token logprobs and entropy, and response scoring for the Megatron model.

At TP 1 the full-vocabulary ``kernels.invariant.token_logprobs`` of the native decoder is used
(bitwise the native scores). At TP > 1 each rank holds a vocabulary slice of the logits; the
log-softmax is assembled with three TP all-reduces (max, sum of exponentials, target logit), in
float32 (float64 in exact mode), without gathering the logits. Padded vocabulary rows
(``layout.padded_vocab``) are masked to -inf.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from megatron.core import parallel_state
from megatron.core.tensor_parallel.mappings import reduce_from_tensor_model_parallel_region
from torch import Tensor

from fp8rl.kernels.invariant import attention_mask, token_logprobs
from fp8rl.workers.model.scoring import PackedBatch
from fp8rl.workers.trainer.megatron.model import forward_hidden, head_weight


def _scaled_local(
    logits: Tensor, vocab: int, temperature: float, exact: bool
) -> tuple[Tensor, int]:
    """Float32/64 logits/temperature of this rank's slice with padded columns at -inf, and the
    slice's first vocabulary id."""
    rank = parallel_state.get_tensor_model_parallel_rank()
    width = logits.shape[-1]
    start = rank * width
    scaled = logits.to(torch.float64 if exact else torch.float32)
    if temperature > 0 and temperature != 1.0:
        scaled = scaled / temperature
    if start + width > vocab:
        ids = torch.arange(start, start + width, device=logits.device)
        scaled = scaled.masked_fill(ids >= vocab, float("-inf"))
    return scaled, start


def vocab_parallel_logprobs(
    logits: Tensor, tokens: Tensor, *, vocab: int, temperature: float, exact: bool
) -> Tensor:
    """log p(tokens) ``[...]`` float32 from this rank's logits slice ``[..., V_pad/tp]``.

    Differentiable (the gradient reaches every rank's slice). ``vocab``: real vocabulary size.
    """
    if parallel_state.get_tensor_model_parallel_world_size() == 1:
        return token_logprobs(logits[..., :vocab], tokens, temperature=temperature, exact=exact)
    scaled, start = _scaled_local(logits, vocab, temperature, exact)
    peak = scaled.detach().amax(dim=-1, keepdim=True)
    dist.all_reduce(
        peak, op=dist.ReduceOp.MAX, group=parallel_state.get_tensor_model_parallel_group()
    )
    shifted = scaled - peak
    total = reduce_from_tensor_model_parallel_region(shifted.exp().sum(dim=-1))
    local = tokens - start
    inside = (local >= 0) & (local < scaled.shape[-1])
    picked = shifted.gather(-1, local.clamp(0, scaled.shape[-1] - 1).unsqueeze(-1)).squeeze(-1)
    target = reduce_from_tensor_model_parallel_region(picked.masked_fill(~inside, 0.0))
    return (target - total.log()).float()


def vocab_parallel_entropy(
    logits: Tensor, *, vocab: int, temperature: float, exact: bool
) -> Tensor:
    """Entropy (nats) ``[...]`` float32 of softmax(logits/temperature) from vocabulary slices."""
    scaled, _ = _scaled_local(logits, vocab, temperature, exact)
    if parallel_state.get_tensor_model_parallel_world_size() == 1:
        scaled = scaled[..., :vocab]
        logp = torch.log_softmax(scaled, dim=-1)
        return -(logp.exp() * logp).sum(dim=-1).float()
    peak = scaled.detach().amax(dim=-1, keepdim=True)
    dist.all_reduce(
        peak, op=dist.ReduceOp.MAX, group=parallel_state.get_tensor_model_parallel_group()
    )
    shifted = scaled - peak
    e = shifted.exp()
    total = reduce_from_tensor_model_parallel_region(e.sum(dim=-1))
    weighted = reduce_from_tensor_model_parallel_region(
        (e * shifted.masked_fill(torch.isinf(shifted), 0.0)).sum(dim=-1)
    )
    return (total.log() - weighted / total).float()


def response_logits(model, batch: PackedBatch, hidden: Tensor | None = None) -> Tensor:
    """This rank's logits slice ``[B, R, V_pad/tp]`` at the positions predicting each response
    token (the native ``scoring.response_hidden`` gather). ``hidden``: the last stage's final
    hidden states ``[B, S, h]`` when already computed (pipeline schedule); else a forward of a
    single-stage model."""
    if hidden is None:
        mask = attention_mask(batch.positions, batch.lengths, batch.input_ids.shape[1])
        hidden = forward_hidden(model, batch.input_ids, mask)
    r = batch.response_ids.shape[1]
    idx = batch.prompt_lengths[:, None] - 1 + torch.arange(r, device=hidden.device)[None]
    idx = idx.clamp(max=batch.input_ids.shape[1] - 1)
    rows = hidden.gather(1, idx[..., None].expand(-1, -1, hidden.shape[-1]))
    return model.output_layer.logits(rows, head_weight(model))


def response_logprobs(model, batch: PackedBatch, *, temperature: float) -> Tensor:
    """log p(response token) ``[B, R]`` float32, 0 where ``response_mask`` is False."""
    logp = vocab_parallel_logprobs(
        response_logits(model, batch),
        batch.response_ids,
        vocab=model.fp8rl_config.vocab_size,
        temperature=temperature,
        exact=model.fp8rl_precision.exact,
    )
    return logp.masked_fill(~batch.response_mask, 0.0)
