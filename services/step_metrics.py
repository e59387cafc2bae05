"""Per-step metrics with the names RL users know (verl / NeMo RL conventions)."""

from __future__ import annotations

from typing import Any

from torch import Tensor

from fp8rl.services.rollout_phase import Rollouts


def rollout_metrics(rollouts: Rollouts) -> dict[str, float]:
    """``reward/*``, ``response_length/*`` (tokens) and dynamic-sampling counters."""
    lengths = [len(s.token_ids) for s in rollouts.samples]
    rewards = rollouts.rewards
    clipped = sum(s.finish_reason == "length" for s in rollouts.samples)
    out = {
        "reward/mean": float(rewards.mean()),
        "reward/std": float(rewards.std()) if len(rewards) > 1 else 0.0,
        "reward/max": float(rewards.max()),
        "reward/min": float(rewards.min()),
        "response_length/mean": sum(lengths) / len(lengths),
        "response_length/max": float(max(lengths)),
        "response_length/clip_ratio": clipped / len(lengths),
        "rollout/resample_rounds": float(rollouts.rounds),
        "rollout/dropped_groups": float(rollouts.dropped_groups),
        "rollout/policy_version": float(rollouts.samples[0].policy_version),
        "timing_s/rollout/generate": rollouts.generate_s,  # parts of timing_s/rollout
        "timing_s/rollout/reward": rollouts.reward_s,
    }
    timeouts = sum(o.timed_out for o in rollouts.outputs)
    if timeouts:
        out["reward/timeouts"] = float(timeouts)
    return out


def generation_rows(rollouts: Rollouts, count: int) -> list[dict]:
    """The first ``count`` samples as table rows for the tracker."""
    rows = []
    n = len(rollouts.samples) // max(1, len(rollouts.records))
    for i, (sample, text, out) in enumerate(
        zip(rollouts.samples, rollouts.texts, rollouts.outputs, strict=True)
    ):
        if i >= count:
            break
        record = rollouts.records[i // n]
        rows.append(
            {
                "prompt": record.question,
                "answer": record.answer,
                "response": text,
                "reward": out.reward,
                "finish_reason": sample.finish_reason,
                "policy_version": sample.policy_version,
            }
        )
    return rows


def throughput(tokens: Tensor | int, seconds: float) -> float:
    """Tokens per second (0 when no time elapsed)."""
    return float(tokens) / seconds if seconds > 0 else 0.0


def step_metrics(
    rollouts: Rollouts,
    batch: Any,
    mismatch: dict[str, float],
    train: dict[str, float],
    timer: Any,
    *,
    version: int,
) -> dict[str, float]:
    """Every scalar of a step: rollout, mismatch, actor/critic, timing and throughput."""
    tokens = batch.packed.response_mask.sum()
    return {
        **rollout_metrics(rollouts),
        **mismatch,
        **train,
        **timer.metrics(),
        "policy_version": float(version),
        "perf/tokens_per_s": throughput(tokens, timer.total),
        "perf/step_s": timer.total,
    }
