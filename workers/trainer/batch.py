"""The tensors the trainer trains on (moved through the Ray object store, not the typed protocol)."""

from __future__ import annotations

from dataclasses import dataclass, fields

import torch
from torch import Tensor

from fp8rl.protocol.algorithm_spec import AlgorithmSpec
from fp8rl.workers.algorithms import rl_objective
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


def micro_objective(
    micro: TrainBatch,
    logp: Tensor,
    entropy: Tensor | None,
    *,
    spec: AlgorithmSpec,
    denominator: float,
) -> tuple[Tensor, dict[str, float]]:
    """``rl_objective`` of one micro-batch: ``logp``/``entropy`` [b, R] from the current policy,
    the rest from ``micro``; ``denominator`` is the mini-batch's global loss denominator.
    Returns the scalar loss and the objective's metrics (both trainers run this)."""
    return rl_objective(
        logp,
        micro.old_logp,
        micro.advantages,
        micro.packed.response_mask,
        spec=spec,
        ref_logp=micro.ref_logp,
        entropy=entropy,
        rollout_logp=micro.rollout_logp,
        loss_denominator=denominator,
    )


@dataclass
class MiniLayout:
    """One mini-batch as one rank sees it.

    Attributes:
        rows: this rank's rows of the mini-batch (consecutive in ``TrainShard.batch``).
        micro_batches: micro-batches every rank runs for this mini-batch (equal on all ranks:
            FSDP's collectives pair up; a rank with fewer rows runs empty, zero-weight ones).
        denominator: loss denominator (tokens or sequences) of the whole mini-batch, all ranks.
    """

    rows: int
    micro_batches: int
    denominator: float


@dataclass
class TrainShard:
    """One trainer rank's part of a step's batch.

    Attributes:
        batch: this rank's rows, mini-batch after mini-batch.
        minis: the layout of each mini-batch (rows, micro-batch count, global denominator).
        index: [rows] int64 row index of each of ``batch``'s rows in the whole batch.
    """

    batch: TrainBatch
    minis: list[MiniLayout]
    index: Tensor

    def micro_batches(self, micro_batch_size: int):
        """Yield ``(mini index, micro TrainBatch or None)``; None = an empty, zero-weight micro."""
        start = 0
        for m, mini in enumerate(self.minis):
            rows = list(range(start, start + mini.rows))
            for k in range(mini.micro_batches):
                part = rows[k * micro_batch_size : (k + 1) * micro_batch_size]
                yield m, (self.batch.select(slice(part[0], part[-1] + 1)) if part else None)
            start += mini.rows


def plan_shards(
    lengths: Tensor,
    *,
    ranks: int,
    mini_batch_size: int,
    micro_batch_size: int,
) -> list[tuple[list[int], list[int], list[int]]]:
    """Token-balanced split of each mini-batch over ``ranks`` with equal micro-batch counts.

    Within each mini-batch (consecutive rows of ``mini_batch_size``) rows go, longest first, to
    the rank holding the fewest tokens among those with the fewest rows, so row counts differ by
    at most one and token counts are balanced. Each rank keeps its rows in batch order.

    Args:
        lengths: [B] int64 tokens per row. ranks, mini_batch_size, micro_batch_size: > 0.
    Returns:
        Per rank: (row indices in shard order, rows per mini-batch, micro-batches per mini-batch;
        the last list is the same on every rank).
    Raises:
        ValueError: a mini-batch has fewer rows than there are ranks.
    """
    total = lengths.shape[0]
    out: list[tuple[list[int], list[int], list[int]]] = [([], [], []) for _ in range(ranks)]
    for start in range(0, total, mini_batch_size):
        rows = list(range(start, min(start + mini_batch_size, total)))
        if len(rows) < ranks:
            raise ValueError(
                f"a mini-batch of {len(rows)} sequences cannot be split over {ranks} trainer "
                "ranks: raise trainer.mini_batch_size (or the batch size) or lower "
                "trainer.num_workers"
            )
        parts: list[list[int]] = [[] for _ in range(ranks)]
        tokens = [0] * ranks
        for row in sorted(rows, key=lambda r: (-int(lengths[r]), r)):
            fewest = min(len(p) for p in parts)
            rank = min(
                (r for r in range(ranks) if len(parts[r]) == fewest), key=lambda r: tokens[r]
            )
            parts[rank].append(row)
            tokens[rank] += int(lengths[row])
        micro = max(-(-len(p) // micro_batch_size) for p in parts)
        for rank, part in enumerate(parts):
            out[rank][0].extend(sorted(part))
            out[rank][1].append(len(part))
            out[rank][2].append(micro)
    return out
