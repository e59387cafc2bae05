"""The rollout half of a step: prompts → samples (n per prompt) → rewards → a TrainBatch skeleton.

Prompts go to the least-loaded rollout engines, each with its own sampling seed; every sample keeps the token ids, logprobs, finish
reason, policy version and fingerprint it was generated with. With DAPO's dynamic sampling,
groups whose rewards are all equal are dropped and more prompts are drawn until the batch is full
(or ``algorithm.max_resample_rounds`` is reached).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

import ray
import torch
from torch import Tensor

from fp8rl.protocol import JobSpec, Prompt, RolloutRequest, RolloutSample, SamplingParams
from fp8rl.protocol.reward_messages import RewardInput, RewardOutput
from fp8rl.services.data import PromptRecord, PromptSampler, render_prompt
from fp8rl.services.reward_pool import RewardPool
from fp8rl.workers.algorithms import dynamic_sampling_keep, overlong_penalty
from fp8rl.workers.model.scoring import PackedBatch, pack
from fp8rl.workers.rollout.sampling import sequence_seed

log = logging.getLogger(__name__)


@dataclass
class Rollouts:
    """One step's generations, grouped: samples[i*n:(i+1)*n] answer records[i]."""

    records: list[PromptRecord]
    samples: list[RolloutSample]
    rewards: Tensor  # [B] float32, total reward per sample (after overlong shaping)
    outputs: list[RewardOutput]
    texts: list[str]
    rounds: int = 1
    dropped_groups: int = 0
    generate_s: float = 0.0  # wall time in the engines
    reward_s: float = 0.0  # wall time scoring

    def packed(self, pad_id: int) -> PackedBatch:
        """Prompt+response ids as generated, right-padded."""
        return pack(
            [s.prompt_token_ids for s in self.samples],
            [s.token_ids for s in self.samples],
            pad_id=pad_id,
        )

    def rollout_logprobs(self, width: int) -> Tensor:
        """Engine logprobs [B, width] float32 (0 on padding)."""
        out = torch.zeros((len(self.samples), width), dtype=torch.float32)
        for i, s in enumerate(self.samples):
            out[i, : len(s.logprobs)] = torch.tensor(s.logprobs, dtype=torch.float32)
        return out


class PromptFeed:
    """Rendered prompts from the training sampler; prompts too long for the spec are skipped."""

    def __init__(self, sampler: PromptSampler, tokenizer: Any, job: JobSpec) -> None:
        self.sampler, self.tokenizer, self.data = sampler, tokenizer, job.data
        self.chat = job.model.chat_template
        self.skipped = 0

    def peek(self, count: int) -> list[tuple[PromptRecord, list[int]]]:
        """The next ``count`` prompts without consuming them (the sampler's cursor is restored)."""
        state, skipped = self.sampler.state_dict(), self.skipped
        try:
            return self.take(count)
        finally:
            self.sampler.load_state_dict(state)
            self.skipped = skipped

    def take(self, count: int) -> list[tuple[PromptRecord, list[int]]]:
        """``count`` (record, token ids) pairs."""
        out: list[tuple[PromptRecord, list[int]]] = []
        while len(out) < count:
            for record in self.sampler.next_batch():
                ids = render_prompt(
                    record,
                    tokenizer=self.tokenizer,
                    template=self.data.prompt_template,
                    system_prompt=self.data.system_prompt,
                    chat_template=self.chat,
                )
                if len(ids) > self.data.max_prompt_tokens:
                    self.skipped += 1
                    if self.skipped <= 3 or self.skipped % 100 == 0:
                        log.warning(
                            "skipping prompt %s: %d tokens > data.max_prompt_tokens=%d (%d skipped so far)",
                            record.prompt_id,
                            len(ids),
                            self.data.max_prompt_tokens,
                            self.skipped,
                        )
                    if self.skipped > 100 * count:
                        raise ValueError(
                            "data.max_prompt_tokens: nearly every prompt is longer; raise it"
                        )
                    continue
                out.append((record, ids))
        return out[:count]


def generate(
    engines: list[Any],
    prompts: list[tuple[str, list[int]]],
    sampling: SamplingParams,
    *,
    request_id: str,
) -> list[RolloutSample]:
    """Dispatch ``(prompt_id, token ids)`` prompts to the least-loaded engines; return the samples
    grouped per prompt in input order.

    Each prompt travels as ``<prompt_id>@<index in this call>`` (repeated records stay distinct)
    with its sampling seed ``sequence_seed(sampling.seed, index)``, so the samples are the same
    whichever engine, and however many engines, run it. The n samples of a prompt stay on one
    engine.

    Raises:
        RuntimeError: engines answered with different policy versions (a weight sync that did not
            reach every engine); the batch would mix policies.
    """
    tagged = [
        Prompt(
            prompt_id=f"{pid}@{i}",
            token_ids=ids,
            seed=None if sampling.seed is None else sequence_seed(sampling.seed, i),
        )
        for i, (pid, ids) in enumerate(prompts)
    ]
    costs = [(len(p.token_ids) + sampling.max_tokens) * sampling.n for p in tagged]
    owner = assign_least_loaded(costs, len(engines))
    calls = {
        rank: engines[rank].generate.remote(
            RolloutRequest(
                request_id=f"{request_id}/{rank}",
                sampling=sampling,
                prompts=[p for p, o in zip(tagged, owner, strict=True) if o == rank],
            )
        )
        for rank in sorted(set(owner))
    }
    results = dict(zip(calls, ray.get(list(calls.values())), strict=True))
    check_one_policy_version({rank: r.policy_version for rank, r in results.items()})
    by_prompt: dict[str, list[RolloutSample]] = {}
    for result in results.values():
        for sample in result.samples:
            by_prompt.setdefault(sample.prompt_id, []).append(sample)
    return [sample for p in tagged for sample in by_prompt[p.prompt_id]]


def assign_least_loaded(costs: list[float], num_engines: int) -> list[int]:
    """Engine of each prompt: the costliest prompts first, each to the engine with the least work
    so far (LPT scheduling; ties to the lowest rank). Deterministic; costs: [P] → [P] ranks."""
    load = [0.0] * num_engines
    owner = [0] * len(costs)
    for i in sorted(range(len(costs)), key=lambda i: (-costs[i], i)):
        rank = min(range(num_engines), key=lambda r: (load[r], r))
        owner[i] = rank
        load[rank] += costs[i]
    return owner


def check_one_policy_version(versions: dict[int, int]) -> None:
    """Refuse results from engines at different policy versions ({engine rank: version}).

    Raises:
        RuntimeError: naming each engine's version.
    """
    if len(set(versions.values())) > 1:
        listed = ", ".join(f"rollout[{rank}] at v{v}" for rank, v in sorted(versions.items()))
        raise RuntimeError(
            f"rollout engines hold different policy versions ({listed}): a weight sync did not "
            "reach every engine, and a batch must come from one policy"
        )


def score(
    reward: RewardPool,
    tokenizer: Any,
    records: list[PromptRecord],
    samples: list[RolloutSample],
    *,
    n: int,
    max_tokens: int,
) -> tuple[list[RewardOutput], list[str]]:
    """Decode responses and score them with the reward pool."""
    texts = [tokenizer.decode(s.token_ids, skip_special_tokens=True) for s in samples]
    inputs = [
        RewardInput(
            prompt_id=records[i // n].prompt_id,
            prompt=records[i // n].question,
            response=text,
            answer=records[i // n].answer,
            finish_reason=s.finish_reason,
            num_tokens=len(s.token_ids),
            max_tokens=max_tokens,
        )
        for i, (s, text) in enumerate(zip(samples, texts, strict=True))
    ]
    return reward.score(inputs), texts


def collect(
    job: JobSpec,
    feed: PromptFeed,
    engines: list[Any],
    reward: RewardPool,
    tokenizer: Any,
    *,
    step: int,
) -> Rollouts:
    """Generate and score one step's batch (with DAPO dynamic sampling when enabled)."""
    algo, n, want = job.algorithm, job.rollout.n, job.data.prompts_per_step
    sampling = SamplingParams(
        n=n,
        temperature=job.rollout.temperature,
        top_p=job.rollout.top_p,
        top_k=job.rollout.top_k,
        max_tokens=job.rollout.max_tokens,
        stop_token_ids=job.rollout.stop_token_ids,
        seed=job.rollout.seed if job.rollout.seed is not None else job.seed * 100003 + step,
    )
    kept = Rollouts([], [], torch.zeros(0), [], [])
    rounds = 0
    while len(kept.records) < want:
        rounds += 1
        prompts = feed.take(want - len(kept.records))
        records = [r for r, _ in prompts]
        sampling = sampling.model_copy(update={"seed": sampling.seed + rounds - 1})
        t0 = time.perf_counter()
        samples = generate(
            engines,
            [(r.prompt_id, ids) for r, ids in prompts],
            sampling,
            request_id=f"step{step}.{rounds}",
        )
        t1 = time.perf_counter()
        outputs, texts = score(
            reward, tokenizer, records, samples, n=n, max_tokens=job.rollout.max_tokens
        )
        kept.generate_s += t1 - t0
        kept.reward_s += time.perf_counter() - t1
        rewards = torch.tensor([o.reward for o in outputs], dtype=torch.float32)
        if algo.overlong_buffer > 0:
            lengths = torch.tensor([len(s.token_ids) for s in samples])
            rewards = (
                rewards
                + overlong_penalty(
                    lengths,
                    max_tokens=job.rollout.max_tokens,
                    overlong_buffer=algo.overlong_buffer,
                    penalty=algo.overlong_penalty,
                ).float()
            )
        keep = torch.ones(len(records), dtype=torch.bool)
        last_round = rounds >= algo.max_resample_rounds
        if algo.dynamic_sampling and not last_round:
            keep = dynamic_sampling_keep(rewards, group_size=n, std_floor=algo.std_floor)
            kept.dropped_groups += int((~keep).sum())
        for g in keep.nonzero().squeeze(-1).tolist():
            if len(kept.records) == want:
                break
            rows = slice(g * n, (g + 1) * n)
            kept.records.append(records[g])
            kept.samples += samples[rows]
            kept.outputs += outputs[rows]
            kept.texts += texts[rows]
            kept.rewards = torch.cat([kept.rewards, rewards[rows]])
    kept.rounds = rounds
    return kept
