"""Where a run's rewards are computed: ``reward.num_workers`` Ray actors, or the driver itself.

- ``num_workers: 0`` scores in the driver process, as verl does for rule-based rewards: no actor,
  no process of its own (0.08 GB on the quickstart's 2-core machine). Verifiers and custom
  functions still run in their bounded child processes (``reward.timeout_s``).
- ``num_workers: N ≥ 1`` starts N ``RewardWorker`` actors; a batch is split into N contiguous
  shares scored at the same time (NeMo RL's environment workers), and the outputs come back in
  the batch's order. ``reward.max_failure_fraction`` applies to each worker's share.
"""

from __future__ import annotations

from typing import Any

import ray

from fp8rl.protocol import RewardSpec
from fp8rl.protocol.reward_messages import RewardInput, RewardOutput


class RewardPool:
    """Scores ``RewardInput``s with the ``RewardWorker``s of one ``RewardSpec``.

    Args:
        spec: the reward terms and ``num_workers`` (0: in this process).
    Raises:
        ValueError: a function name cannot be resolved or a pattern is not RE2 (in-process
            workers raise here; actors raise at their first call).
    """

    def __init__(self, spec: RewardSpec) -> None:
        from fp8rl.workers.reward.worker import RewardWorker

        self.local = RewardWorker(spec) if spec.num_workers == 0 else None
        self.actors: list[Any] = [
            ray.remote(RewardWorker).options(num_cpus=0, max_concurrency=2).remote(spec)
            for _ in range(spec.num_workers)
        ]

    def score(self, items: list[RewardInput]) -> list[RewardOutput]:
        """One ``RewardOutput`` per item, in order.

        Raises:
            RewardFailure: too many of a share's items timed out or failed (``RewardWorker``).
        """
        if self.local is not None:
            return self.local.score(items)
        shares = _split(items, len(self.actors))
        calls = [
            a.score.remote(share) for a, share in zip(self.actors, shares, strict=True) if share
        ]
        return [out for outputs in ray.get(calls) for out in outputs]

    def close(self) -> None:
        """Stop an in-process worker's verifier children (actors are killed by their owner)."""
        if self.local is not None:
            self.local.close()


def _split(items: list, parts: int) -> list[list]:
    """``items`` in ``parts`` contiguous shares whose sizes differ by at most one."""
    size, extra = divmod(len(items), parts)
    shares, start = [], 0
    for p in range(parts):
        end = start + size + (p < extra)
        shares.append(items[start:end])
        start = end
    return shares
