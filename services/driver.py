"""The fp8rl driver: the RL loop, readable as the algorithm (DESIGN.md §5).

    python -m fp8rl.services.driver SPEC.yaml [key=value ...]

The same entry point serves ``fp8rl run``, ``ray job submit`` and the REST API. Every detail —
rollout, rewards, scoring, advantages, the update, weight sync — lives behind a named call.
"""

from __future__ import annotations

import logging
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import ray
import torch

from fp8rl.protocol import JobSpec, RunState, SpecError, load_job_spec
from fp8rl.services.data import PromptSampler, build_dataset
from fp8rl.services.progress import StepProgress
from fp8rl.services.rollout_phase import PromptFeed, collect
from fp8rl.services.run_dir import prepare_run_dir
from fp8rl.services.runtime import init_ray, launch_workers, sync_weights
from fp8rl.services.step_metrics import generation_rows, rollout_metrics, throughput
from fp8rl.services.tracking import Tracker
from fp8rl.workers.algorithms import (
    compute_advantages,
    kl_reward_penalty,
    mismatch_by_position,
    mismatch_metrics,
)
from fp8rl.workers.model.loading import load_tokenizer, resolve_model
from fp8rl.workers.trainer.batch import TrainBatch

log = logging.getLogger("fp8rl.driver")


def run(job: JobSpec, *, reporter: Any = None) -> dict[str, float]:
    """Run ``job`` to the end (or until a stop is requested); return the last step's metrics."""
    run_dir = prepare_run_dir(job)
    tracker = Tracker(run_dir, job.logging, config=job.model_dump(mode="json"))
    init_ray(job.resources.ray_address)
    workers = launch_workers(job)
    tokenizer = load_tokenizer(resolve_model(job.model.path, load_weights=False).tokenizer_dir)
    sampler = PromptSampler(
        build_dataset(job.data.train),
        batch_size=job.data.prompts_per_step,
        shuffle=job.data.shuffle,
        seed=job.seed,
    )
    feed = PromptFeed(sampler, tokenizer, job)
    sync_weights(
        workers, include_reference=True
    )  # version 0: engines hold the trainer's exact codes
    if reporter:
        reporter.started(quant_fingerprint=job.precision.quant.fingerprint(), run_dir=str(run_dir))
    progress, metrics = StepProgress(job.steps), {}
    for step in range(job.steps):
        timer = PhaseTimer()
        with timer("rollout"):
            rollouts = collect(job, feed, workers.rollout, workers.reward, tokenizer, step=step)
        batch = TrainBatch(
            packed=rollouts.packed(pad_id=tokenizer.pad_token_id or 0),
            rollout_logp=None,
            old_logp=None,
            advantages=None,
            ref_logp=None,
            policy_version=rollouts.samples[0].policy_version,
            temperature=job.rollout.temperature,
        )
        mask = batch.packed.response_mask
        batch.rollout_logp = rollouts.rollout_logprobs(mask.shape[1])
        with timer("ref"):
            if workers.reference is not None:
                batch.ref_logp = ray.get(
                    workers.reference.logprobs.remote(batch.packed, temperature=batch.temperature)
                )
        with timer("old_logp"):
            batch.old_logp = ray.get(workers.trainer.logprobs.remote(batch))
        mismatch = mismatch_metrics(batch.old_logp, batch.rollout_logp, mask)
        token_rewards = None
        if job.algorithm.kl.coef > 0 and job.algorithm.kl.use == "reward":
            token_rewards = kl_reward_penalty(
                batch.old_logp, batch.ref_logp, mask, kl=job.algorithm.kl
            )
        batch.advantages, _ = compute_advantages(
            rollouts.rewards,
            mask,
            spec=job.algorithm,
            group_size=job.rollout.n,
            token_rewards=token_rewards,
        )
        with timer("train"):
            train_metrics = ray.get(workers.trainer.train.remote(batch))
        with timer("sync"):
            version = sync_weights(workers)
        metrics = {
            **rollout_metrics(rollouts, max_tokens=job.rollout.max_tokens),
            **mismatch,
            **train_metrics,
            **timer.metrics(),
            "policy_version": float(version),
            "perf/tokens_per_s": throughput(mask.sum(), timer.total),
        }
        tracker.log(step, metrics)
        tracker.log_generations(step, generation_rows(rollouts, job.logging.log_generations))
        tracker.log_curve(
            step,
            "mismatch_by_position",
            mismatch_by_position(batch.old_logp, batch.rollout_logp, mask),
        )
        progress.update(step, metrics)
        if reporter:
            reporter.step(step, metrics)
            if reporter.stop_requested():
                log.info("stop requested after step %d", step)
                break
    progress.close(metrics)
    tracker.close()
    return metrics


class PhaseTimer:
    """Wall time per phase of a step → ``timing_s/<phase>`` and ``timing_s/step``."""

    def __init__(self) -> None:
        self.start, self.phases = time.perf_counter(), {}

    @contextmanager
    def __call__(self, name: str):
        t0 = time.perf_counter()
        yield
        self.phases[name] = self.phases.get(name, 0.0) + time.perf_counter() - t0

    @property
    def total(self) -> float:
        """Seconds since the step started."""
        return time.perf_counter() - self.start

    def metrics(self) -> dict[str, float]:
        """Timing metrics of the step."""
        return {**{f"timing_s/{k}": v for k, v in self.phases.items()}, "timing_s/step": self.total}


def main(argv: list[str] | None = None) -> int:
    """``python -m fp8rl.services.driver SPEC [k=v ...]``; exit 0 done, 1 failed, 2 bad spec, 130 Ctrl-C."""
    from fp8rl.services.store.reporter import reporter_from_env

    args = sys.argv[1:] if argv is None else argv
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    if not args or args[0] in ("-h", "--help"):
        print(main.__doc__)
        return 0 if args else 2
    reporter = reporter_from_env()
    try:
        job = load_job_spec(Path(args[0]), args[1:])
    except SpecError as exc:
        print(exc, file=sys.stderr)
        if reporter:
            reporter.finished(RunState.FAILED, str(exc))
        return 2
    torch.manual_seed(job.seed)
    try:
        run(job, reporter=reporter)
    except KeyboardInterrupt:
        print("interrupted: run stopped", file=sys.stderr)
        if reporter:
            reporter.finished(RunState.STOPPED, "interrupted (Ctrl-C / SIGINT)")
        return 130
    except Exception as exc:  # the run failed: say why, once, without a bare traceback
        log.exception("run failed")
        if reporter:
            reporter.finished(RunState.FAILED, f"{type(exc).__name__}: {exc}")
        print(f"run failed: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    if reporter:
        reporter.finished(RunState.STOPPED if reporter.stop_requested() else RunState.SUCCEEDED)
    return 0


if __name__ == "__main__":
    sys.exit(main())
