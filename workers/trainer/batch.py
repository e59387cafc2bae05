"""The tensors the trainer trains on (moved through the Ray object store, not the typed protocol)."""

from __future__ import annotations

from dataclasses import dataclass, fields

import torch
from torch import Tensor

from fp8rl.workers.model.scoring import PackedBatch


@dataclass
class TrainBatch:
    """One rollout batch, response-token aligned ([B, R] tensors share ``packed.response_mask``).

    Attributes:
        packed: prompt+response token ids as generated (never re-tokenised).
        rollout_logp: engine logprobs of the sampled tokens (float32).
        old_logp: trainer logprobs before this step's update (float32).
        advantages: per-token advantages (float32).
        ref_logp: reference logprobs, or None when no KL is used.
        policy_version: version of the weights that generated the batch.
        temperature: sampling temperature (logprobs are of softmax(logits/T)).
    """

    packed: PackedBatch
    rollout_logp: Tensor
    old_logp: Tensor
    advantages: Tensor
    ref_logp: Tensor | None
    policy_version: int
    temperature: float

    def __len__(self) -> int:
        return self.packed.input_ids.shape[0]

    def select(self, rows: slice) -> TrainBatch:
        """Rows ``rows`` (a mini- or micro-batch), response tensors trimmed like ``packed``."""
        packed = self.packed.select(rows)
        r = packed.response_ids.shape[1]
        cut = {f.name: getattr(self, f.name) for f in fields(self)}
        for name in ("rollout_logp", "old_logp", "advantages", "ref_logp"):
            if cut[name] is not None:
                cut[name] = cut[name][rows][:, :r]
        cut["packed"] = packed
        return TrainBatch(**cut)

    def to(self, device: torch.device | str) -> TrainBatch:
        """The same batch on ``device``."""
        cut = {f.name: getattr(self, f.name) for f in fields(self)}
        for name, value in cut.items():
            if isinstance(value, Tensor | PackedBatch):
                cut[name] = value.to(device)
        return TrainBatch(**cut)
