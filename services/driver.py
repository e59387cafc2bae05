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
from fp8rl.services.checkpoint import Checkpointer, checkpoint_step
from fp8rl.services.data import PromptSampler, build_dataset
from fp8rl.services.eval_phase import Evaluator
from fp8rl.services.rollout_phase import PromptFeed, collect
from fp8rl.services.run_dir import prepare_run_dir
from fp8rl.services.runtime import check_supported, init_ray, launch_workers, sync_weights
from fp8rl.services.step_batch import (
    advantages,
    calibrate_kv_cache,
    critic_values,
    new_batch,
    reference_logprobs,
    train,
)
from fp8rl.services.step_metrics import generation_rows, rollout_metrics, throughput
from fp8rl.services.tracking import Tracker
from fp8rl.workers.algorithms import mismatch_by_position, mismatch_metrics
from fp8rl.workers.model.loading import load_tokenizer, resolve_model

log = logging.getLogger("fp8rl.driver")


def run(job: JobSpec, *, reporter: Any = None) -> dict[str, float]:
    """Run ``job`` to the end (or until a stop is requested); return the last step's metrics."""
    run_dir = prepare_run_dir(job)
    checkpoints = Checkpointer(run_dir, job)
    resume = checkpoints.resolve()  # refuses a checkpoint of another quant contract up front
    start = checkpoint_step(resume)  # steps already done (0: a fresh start)
    tracker = Tracker(
        run_dir,
        job.logging,
        config=job.model_dump(mode="json"),
        total_steps=job.steps,
        start_step=start,
    )
    check_supported(job)  # before anything starts: unimplemented backends, missing data
    tokenizer = load_tokenizer(resolve_model(job.model.path, load_weights=False).tokenizer_dir)
    sampler = PromptSampler(
        build_dataset(job.data.train),
        batch_size=job.data.prompts_per_step,
        shuffle=job.data.shuffle,
        seed=job.seed,
    )
    feed = PromptFeed(sampler, tokenizer, job)
    evaluator = Evaluator(job, tokenizer)
    tracker.status("starting Ray workers and loading the model")
    init_ray(job.resources.ray_address)
    workers = launch_workers(job)
    calibrate_kv_cache(workers, job, feed)
    sync_weights(
        workers, include_reference=True
    )  # version 0: engines hold the trainer's exact codes
    if resume:  # trainer state, data cursor, RNG; the reference keeps the initial policy
        checkpoints.restore(resume, workers.trainer, sampler)
        sync_weights(workers)
    if reporter:
        reporter.started(quant_fingerprint=job.precision.quant.fingerprint(), run_dir=str(run_dir))
    metrics, done, stopped = {}, start, False
    for step in range(start, job.steps):
        tracker.status(f"step {step} running")
        timer = PhaseTimer()
        with timer("rollout"):
            rollouts = collect(job, feed, workers.rollout, workers.reward, tokenizer, step=step)
        batch = new_batch(rollouts, job, pad_id=tokenizer.pad_token_id or 0)
        with timer("ref"):
            batch.ref_logp = reference_logprobs(workers, batch)
        with timer("old_logp"):
            batch.old_logp = ray.get(workers.trainer.logprobs.remote(batch))
            values = critic_values(workers, batch)
        mask = batch.packed.response_mask
        mismatch = mismatch_metrics(batch.old_logp, batch.rollout_logp, mask)
        batch.advantages, returns = advantages(job, rollouts, batch, values)
        with timer("train"):
            train_metrics = train(workers, batch, returns=returns, values=values)
        with timer("sync"):
            version = sync_weights(workers)
        metrics = {
            **rollout_metrics(rollouts, max_tokens=job.rollout.max_tokens),
            **mismatch,
            **train_metrics,
            **timer.metrics(),
            "policy_version": float(version),
            "perf/tokens_per_s": throughput(mask.sum(), timer.total),
            "perf/step_s": timer.total,
        }
        tracker.log(step, metrics)
        tracker.log_generations(step, generation_rows(rollouts, job.logging.log_generations))
        tracker.log_curve(
            step,
            "mismatch_by_position",
            mismatch_by_position(batch.old_logp, batch.rollout_logp, mask),
        )
        if evaluator.due(step):
            tracker.status(f"step {step}: evaluating")
            val_metrics, rows = evaluator.run(step, workers.rollout, workers.reward)
            tracker.log_validation(step, val_metrics, rows[: job.logging.log_generations])
            metrics.update(val_metrics)
        done = step + 1
        checkpoints.maybe_save(done, workers.trainer, sampler)
        if reporter:
            reporter.step(done, metrics)  # the API counts completed steps (1 after the first)
            if reporter.stop_requested():
                log.info("stop requested after step %d", step)
                stopped = True
                break
    checkpoints.finish(done, workers.trainer, sampler, stopped=stopped)
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
    """``python -m fp8rl.services.driver SPEC [k=v ...]``.

    Exit codes: 0 done, 2 a user error (bad spec, missing file, unsupported option), 1 any other
    failure (traceback in the log), 130 Ctrl-C."""
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
    except Exception as exc:  # the run failed: say why, once
        cause = getattr(exc, "cause", None) or exc  # a worker's error arrives wrapped by Ray
        user_error = isinstance(cause, ValueError | FileNotFoundError)
        if not user_error:  # a bug: keep the traceback in the log
            log.exception("run failed")
        reason = f"{type(cause).__name__}: {cause}"
        if reporter:
            reporter.finished(RunState.FAILED, reason)
        print(f"run failed: {reason}", file=sys.stderr)
        return 2 if user_error else 1
    if reporter:
        reporter.finished(RunState.STOPPED if reporter.stop_requested() else RunState.SUCCEEDED)
    return 0


if __name__ == "__main__":
    sys.exit(main())
