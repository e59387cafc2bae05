"""Score the exact token ids a rollout produced: pack (prompt, response) pairs, gather logprobs.

The trainer, the reference worker and ``fp8rl mismatch`` all score responses through
``response_logprobs`` — never by re-tokenising text — so the trainer's logprob of a token is
computed from the same ids, positions and key layout the engine used (keys at index = position).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from fp8rl.workers.model.decoder import Decoder


@dataclass
class PackedBatch:
    """Right-padded sequences prompt+response.

    Attributes:
        input_ids: [B, L] int64, padded with ``pad_id``.
        positions: [B, L] int64 (0..L-1).
        lengths: [B] int64 valid tokens per row.
        prompt_lengths: [B] int64.
        response_ids: [B, R] int64 response tokens, padded with 0.
        response_mask: [B, R] bool, True on real response tokens.
    """

    input_ids: Tensor
    positions: Tensor
    lengths: Tensor
    prompt_lengths: Tensor
    response_ids: Tensor
    response_mask: Tensor

    def to(self, device: torch.device | str) -> PackedBatch:
        """The same batch on ``device``."""
        return PackedBatch(*(getattr(self, f).to(device) for f in self.__dataclass_fields__))

    def select(self, rows: slice | Tensor) -> PackedBatch:
        """A sub-batch (micro-batch) of rows, trimmed to its own longest row."""
        sub = PackedBatch(*(getattr(self, f)[rows] for f in self.__dataclass_fields__))
        length = int(sub.lengths.max())
        resp = int(sub.response_mask.sum(-1).max()) if sub.response_mask.numel() else 0
        resp = max(resp, 1)
        return PackedBatch(
            sub.input_ids[:, :length],
            sub.positions[:, :length],
            sub.lengths,
            sub.prompt_lengths,
            sub.response_ids[:, :resp],
            sub.response_mask[:, :resp],
        )


def pack(
    prompts: Sequence[Sequence[int]], responses: Sequence[Sequence[int]], *, pad_id: int = 0
) -> PackedBatch:
    """Pack token-id pairs into a PackedBatch (CPU tensors).

    Raises:
        ValueError: a prompt is empty or the two lists differ in length.
    """
    if len(prompts) != len(responses):
        raise ValueError(f"{len(prompts)} prompts for {len(responses)} responses")
    if any(len(p) == 0 for p in prompts):
        raise ValueError("every prompt needs at least one token")
    b = len(prompts)
    lengths = [len(p) + len(r) for p, r in zip(prompts, responses, strict=True)]
    length, resp = max(lengths), max(1, max(len(r) for r in responses))
    input_ids = torch.full((b, length), pad_id, dtype=torch.long)
    response_ids = torch.zeros((b, resp), dtype=torch.long)
    response_mask = torch.zeros((b, resp), dtype=torch.bool)
    for i, (p, r) in enumerate(zip(prompts, responses, strict=True)):
        seq = list(p) + list(r)
        input_ids[i, : len(seq)] = torch.tensor(seq, dtype=torch.long)
        if r:
            response_ids[i, : len(r)] = torch.tensor(list(r), dtype=torch.long)
            response_mask[i, : len(r)] = True
    return PackedBatch(
        input_ids=input_ids,
        positions=torch.arange(length).expand(b, length).contiguous(),
        lengths=torch.tensor(lengths),
        prompt_lengths=torch.tensor([len(p) for p in prompts]),
        response_ids=response_ids,
        response_mask=response_mask,
    )


def response_hidden(model: Decoder, batch: PackedBatch) -> Tensor:
    """Hidden states [B, R, H] that predict each response token (the state one position before it)."""
    hidden = model(batch.input_ids, batch.positions, batch.lengths)
    r = batch.response_ids.shape[1]
    idx = batch.prompt_lengths[:, None] - 1 + torch.arange(r, device=hidden.device)[None]
    idx = idx.clamp(max=hidden.shape[1] - 1)
    return hidden.gather(1, idx[..., None].expand(-1, -1, hidden.shape[-1]))


def response_logprobs(model: Decoder, batch: PackedBatch, *, temperature: float) -> Tensor:
    """log p(response token) [B, R] float32 (0 where ``response_mask`` is False)."""
    logp = model.token_logprobs(
        response_hidden(model, batch), batch.response_ids, temperature=temperature
    )
    return logp.masked_fill(~batch.response_mask, 0.0)
