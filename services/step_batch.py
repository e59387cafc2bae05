"""From a step's rollouts to the trainer's batch: logprobs of every role, advantages, critic.

Named steps of the driver's loop (``services/driver.py``); each is a few lines of glue around the
pure math in ``workers/algorithms`` and the actors in ``Workers``.
"""

from __future__ import annotations

from typing import Any

import ray
from torch import Tensor

from fp8rl.protocol import JobSpec
from fp8rl.services.rollout_phase import Rollouts
from fp8rl.services.runtime import Workers
from fp8rl.workers.algorithms import compute_advantages, kl_reward_penalty
from fp8rl.workers.trainer.batch import TrainBatch


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
    """The frozen reference policy's logprobs [B, R] (None without a reference worker)."""
    if workers.reference is None:
        return None
    return ray.get(workers.reference.logprobs.remote(batch.packed, temperature=batch.temperature))


def trainer_logprobs(workers: Workers, batch: TrainBatch) -> Tensor:
    """The current policy's logprobs [B, R] of the batch (the trainer's forward, no update)."""
    return ray.get(workers.trainer.logprobs.remote(batch))


def critic_values(workers: Workers, batch: TrainBatch) -> Tensor | None:
    """V(s_t) [B, R] from the critic (None unless the estimator is GAE)."""
    if workers.critic is None:
        return None
    return ray.get(workers.critic.values.remote(batch.packed))


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
    workers: Workers, batch: TrainBatch, *, returns: Tensor, values: Tensor | None
) -> dict[str, float]:
    """Policy update (and the critic's, for GAE) on the batch; their metrics."""
    policy = workers.trainer.train.remote(batch)
    critic: Any = None
    if workers.critic is not None:
        critic = workers.critic.train.remote(batch.packed, returns, values)
    return {**ray.get(policy), **(ray.get(critic) if critic is not None else {})}


def calibrate_kv_cache(workers: Workers, job: JobSpec, feed: Any) -> None:
    """Initial FP8 KV-cache scales from the first prompts (no-op without an FP8 KV cache)."""
    if job.precision.quant.kv_cache_dtype == "auto":
        return
    from fp8rl.workers.model.scoring import pack

    prompts = [ids for _, ids in feed.peek(job.data.prompts_per_step)]
    ray.get(workers.trainer.calibrate_kv.remote(pack(prompts, [[] for _ in prompts])))
