"""From a step's rollouts to the trainer's batch: logprobs of every role, advantages, critic.

Named steps of the driver's loop (``services/driver.py``); each is a few lines of glue around the
pure math in ``workers/algorithms`` and the actors in ``Workers``.
"""

from __future__ import annotations

from typing import Any

import ray
import torch
from torch import Tensor

from fp8rl.protocol import JobSpec
from fp8rl.services.rollout_phase import Rollouts
from fp8rl.services.runtime import Workers
from fp8rl.workers.algorithms import compute_advantages, kl_reward_penalty
from fp8rl.workers.critic.worker import critic_shards
from fp8rl.workers.trainer.batch import TrainBatch, TrainShard
from fp8rl.workers.trainer.worker import shard_batch


def new_batch(rollouts: Rollouts, job: JobSpec, *, pad_id: int) -> TrainBatch:
    """The generated token ids (never re-tokenised) and the engine's logprobs of them."""
    packed = rollouts.packed(pad_id=pad_id)
    rollout_logp = rollouts.rollout_logprobs(packed.response_mask.shape[1])
    return TrainBatch(
        packed=packed,
        rollout_logp=rollout_logp,
        old_logp=None,
        advantages=None,
        ref_logp=None,
        policy_version=rollouts.samples[0].policy_version,
        temperature=job.rollout.temperature,
    )


def reference_logprobs(workers: Workers, batch: TrainBatch) -> Tensor | None:
    """The frozen reference policy's logprobs [B, R] (None without a reference worker); rows
    are split over the ``reference.num_workers`` actors."""
    refs = workers.references
    if not refs:
        return None
    parts = torch.arange(len(batch)).tensor_split(len(refs))
    calls = [
        r.logprobs.remote(batch.packed.select(rows), temperature=batch.temperature)
        for r, rows in zip(refs, parts, strict=True)
        if len(rows)
    ]
    width = batch.packed.response_ids.shape[1]
    return torch.cat([_pad(x, width) for x in ray.get(calls)])


def trainer_logprobs(workers: Workers, batch: TrainBatch, job: JobSpec) -> Tensor:
    """The current policy's logprobs [B, R] of the batch (every trainer rank scores its shard)."""
    shards = trainer_shards(batch, job)
    results = ray.get([t.logprobs.remote(s) for t, s in zip(workers.trainers, shards, strict=True)])
    out = torch.zeros(batch.packed.response_ids.shape, dtype=torch.float32)
    for shard, logp in zip(shards, results, strict=True):
        if logp is not None:  # None: a Megatron rank that is not on the last pipeline stage
            out[shard.index, : logp.shape[1]] = logp
    return out


def trainer_shards(batch: TrainBatch, job: JobSpec) -> list[TrainShard]:
    """One token-balanced shard per trainer rank, with global loss denominators.

    ``trainer.backend=megatron``: one shard per data-parallel replica; every TP/PP rank of a
    replica gets its replica's shard (rank order tp-dp-pp, ``megatron.layout``).
    """
    t = job.trainer
    layout = None
    if t.backend == "megatron":
        from fp8rl.workers.trainer.megatron.layout import ParallelLayout

        layout = ParallelLayout.from_world(
            t.num_workers, tp=t.tensor_parallel_size, pp=t.pipeline_parallel_size
        )
    shards = shard_batch(
        batch,
        ranks=t.num_workers if layout is None else layout.dp,
        mini_batch_size=t.mini_batch_size or len(batch),
        micro_batch_size=t.micro_batch_size,
        loss_agg=job.algorithm.loss_agg,
    )
    if layout is None:
        return shards
    return [shards[layout.coords(rank)[1]] for rank in range(t.num_workers)]


def _pad(x: Tensor, width: int) -> Tensor:
    return torch.nn.functional.pad(x, (0, width - x.shape[1]))


def critic_values(workers: Workers, batch: TrainBatch, job: JobSpec) -> Tensor | None:
    """V(s_t) [B, R] from the critic ranks, each scoring its shard (None unless GAE)."""
    if not workers.critics:
        return None
    shards = critic_shards(
        batch, ranks=len(workers.critics), micro_batch_size=job.trainer.micro_batch_size
    )
    parts = ray.get([c.values.remote(s) for c, s in zip(workers.critics, shards, strict=True)])
    out = torch.zeros(batch.packed.response_ids.shape, dtype=torch.float32)
    for shard, values in zip(shards, parts, strict=True):
        out[shard.index, : values.shape[1]] = values
    return out


def advantages(
    job: JobSpec, rollouts: Rollouts, batch: TrainBatch, values: Tensor | None
) -> tuple[Tensor, Tensor]:
    """Advantages and returns [B, R] for ``algorithm.advantage_estimator`` (KL as reward if asked)."""
    mask = batch.packed.response_mask
    token_rewards = None
    if job.algorithm.kl.coef > 0 and job.algorithm.kl.use == "reward":
        token_rewards = kl_reward_penalty(batch.old_logp, batch.ref_logp, mask, kl=job.algorithm.kl)
    return compute_advantages(
        rollouts.rewards,
        mask,
        spec=job.algorithm,
        group_size=job.rollout.n,
        values=values,
        token_rewards=token_rewards,
    )


def train(
    workers: Workers, batch: TrainBatch, job: JobSpec, *, returns: Tensor, values: Tensor | None
) -> dict[str, float]:
    """Policy update on every trainer rank's shard (and the critic's, for GAE); their metrics
    (the trainer's are reduced across ranks; rank 0 reports them)."""
    shards = trainer_shards(batch, job)
    policy = [t.train.remote(s) for t, s in zip(workers.trainers, shards, strict=True)]
    critic = []
    if workers.critics:
        shards = critic_shards(
            batch, ranks=len(workers.critics), micro_batch_size=job.trainer.micro_batch_size
        )
        critic = [
            c.train.remote(s, returns[s.index], values[s.index])
            for c, s in zip(workers.critics, shards, strict=True)
        ]
    return {**ray.get(policy)[0], **(ray.get(critic)[0] if critic else {})}


def calibrate_kv_cache(workers: Workers, job: JobSpec, feed: Any) -> None:
    """Initial FP8 KV-cache scales from the first prompts (no-op without an FP8 KV cache)."""
    if job.precision.quant.kv_cache_dtype == "auto":
        return
    from fp8rl.workers.model.scoring import pack

    prompts = [ids for _, ids in feed.peek(job.data.prompts_per_step)]
    batch = pack(prompts, [[] for _ in prompts])
    ray.get([t.calibrate_kv.remote(batch) for t in workers.trainers])
