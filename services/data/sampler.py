"""Deterministic prompt batches with a checkpointable cursor.

Each epoch is a permutation of the records drawn from ``(seed, epoch)`` alone, so the order
never depends on how many batches were drawn before a restart; batches run across epoch
boundaries (every batch is full). ``state_dict()`` is ``{epoch, cursor, ...}``: a sampler
restored from it yields exactly the batches the original would have yielded next.
"""

from __future__ import annotations

import random
from typing import Any

from fp8rl.services.data.records import PromptRecord


class PromptSampler:
    """Batches of ``batch_size`` records; shuffled per epoch when ``shuffle`` (seeded).

    Raises ``ValueError`` for an empty record list or ``batch_size < 1``.
    """

    def __init__(
        self, records: list[PromptRecord], *, batch_size: int, shuffle: bool, seed: int
    ) -> None:
        if not records:
            raise ValueError("PromptSampler got no records (is the dataset empty or `limit` 0?)")
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self.records, self.batch_size, self.shuffle, self.seed = records, batch_size, shuffle, seed
        self.epoch, self.cursor = 0, 0
        self._order = self._epoch_order(0)

    def _epoch_order(self, epoch: int) -> list[int]:
        order = list(range(len(self.records)))
        if self.shuffle:
            random.Random(f"fp8rl-sampler:{self.seed}:{epoch}").shuffle(order)
        return order

    def next_batch(self) -> list[PromptRecord]:
        """The next ``batch_size`` records (continuing into the next epoch when one ends)."""
        batch: list[PromptRecord] = []
        while len(batch) < self.batch_size:
            if self.cursor == len(self._order):
                self.epoch, self.cursor = self.epoch + 1, 0
                self._order = self._epoch_order(self.epoch)
            take = min(self.batch_size - len(batch), len(self._order) - self.cursor)
            batch.extend(self.records[i] for i in self._order[self.cursor : self.cursor + take])
            self.cursor += take
        return batch

    def state_dict(self) -> dict[str, Any]:
        """The data cursor for checkpoints (plain ints and bools, JSON-safe)."""
        return {
            "epoch": self.epoch,
            "cursor": self.cursor,
            "seed": self.seed,
            "shuffle": self.shuffle,
            "num_records": len(self.records),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from ``state``. Raises ``ValueError`` when the dataset size, seed or shuffle differ."""
        for key, mine in (
            ("num_records", len(self.records)),
            ("seed", self.seed),
            ("shuffle", self.shuffle),
        ):
            if state[key] != mine:
                raise ValueError(
                    f"data cursor was saved with {key}={state[key]} but this sampler has {key}={mine}; "
                    "the checkpoint does not belong to this dataset/seed"
                )
        if not 0 <= state["cursor"] <= state["num_records"]:
            raise ValueError(f"data cursor {state['cursor']} outside 0..{state['num_records']}")
        self.epoch, self.cursor = int(state["epoch"]), int(state["cursor"])
        self._order = self._epoch_order(self.epoch)
