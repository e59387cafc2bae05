"""The fp8rl driver: the RL loop, readable as the algorithm (DESIGN.md §5).

    python -m fp8rl.services.driver SPEC.yaml [key=value ...]

The same entry point serves ``fp8rl run``, ``ray job submit`` and the REST API. Every detail —
rollout, rewards, scoring, advantages, the update, weight sync — lives behind a named call.
"""

from __future__ import annotations

import logging
import re
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from fp8rl.protocol import JobSpec, RunState, SpecError, load_job_spec
from fp8rl.services.checkpoint import CheckpointCorruptError, checkpoint_step, latest_checkpoint
from fp8rl.services.checkpoint_manifest import CHECKPOINTS
from fp8rl.services.checkpointer import Checkpointer
from fp8rl.services.data import PromptSampler, build_dataset
from fp8rl.services.eval_phase import Evaluator
from fp8rl.services.health import HealthGuard
from fp8rl.services.mismatch_attribution import attribution_due, attribution_metrics
from fp8rl.services.model_cache import convert_gguf_in_child
from fp8rl.services.oom import oom_message
from fp8rl.services.preflight import preflight
from fp8rl.services.rollout_phase import PromptFeed, collect
from fp8rl.services.run_dir import lock_run_dir, prepare_run_dir, run_dir_of
from fp8rl.services.run_summary import RunResult, closing_lines, continue_command
from fp8rl.services.runtime import Workers, init_ray, local_cpu_threads, running_workers
from fp8rl.services.spec_warnings import spec_warnings
from fp8rl.services.step_batch import (
    advantages,
    calibrate_kv_cache,
    critic_values,
    new_batch,
    reference_logprobs,
    train,
    trainer_logprobs,
)
from fp8rl.services.step_metrics import generation_rows, step_metrics
from fp8rl.services.stop_signal import StopOnSignal
from fp8rl.services.tracking import Tracker
from fp8rl.services.weights import sync_weights
from fp8rl.workers.algorithms import mismatch_by_position, mismatch_metrics
from fp8rl.workers.model.loading import load_tokenizer, resolve_model

log = logging.getLogger("fp8rl.driver")

USER_ERRORS = (ValueError, FileNotFoundError)
"""Errors a person fixes (exit 2, the message without a traceback): a bad spec or option, a
missing file, a resume refused because no checkpoint passes verification (``ResumeRefused``)."""


_ERROR_LINE = re.compile(r"^(?:[A-Za-z_][\w.]*\.)?([A-Za-z_]\w*(?:Error|Exception)): (.+)$")
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def actor_init_user_error(exc: BaseException) -> str | None:
    """``Type: message`` of a user error raised in a worker's ``__init__`` (a missing weight file,
    a bad model config, ``resources.device=cuda`` without a GPU), or None.

    Ray reports such a failure as ``ActorDiedError``, which keeps the worker's exception only as
    text (its traceback, then the ``Type: message`` line last), not as an object: the last such
    line is read back, and kept when its type is one of ``USER_ERRORS`` by name (the driver then
    prints it without Ray's traceback and exits 2)."""
    if not getattr(exc, "actor_init_failed", False):
        return None
    names = {cls.__name__ for cls in USER_ERRORS}
    lines = _ANSI.sub("", str(exc)).splitlines()
    found = [m for m in map(_ERROR_LINE.match, (line.strip() for line in lines)) if m]
    if not found or found[-1].group(1) not in names:
        return None
    return f"{found[-1].group(1)}: {found[-1].group(2)} (raised while a worker started)"


class ResumeRefused(ValueError):
    """No checkpoint to resume from passes verification; the message names the files and the way
    out. (A ``CheckpointCorruptError`` while saving stays a storage fault: exit 1, traceback.)"""


@dataclass
class Session:
    """What one run holds besides its Ray actors."""

    job: JobSpec
    tracker: Tracker
    checkpoints: Checkpointer
    resume: Path | None
    start: int
    tokenizer: Any
    sampler: PromptSampler
    feed: PromptFeed
    evaluator: Evaluator
    reporter: Any
    signals: StopOnSignal | None = None

    def stop_requested(self) -> bool:
        """A Ctrl-C / SIGTERM, or a stop through the API (``fp8rl runs stop``)."""
        by_signal = self.signals is not None and self.signals.requested
        return by_signal or bool(self.reporter and self.reporter.stop_requested())


def run(job: JobSpec, *, reporter: Any = None) -> RunResult:
    """Run ``job`` to the end or until a stop is requested (Ctrl-C/SIGTERM once, or the API).

    A stop ends after the current step with a checkpoint; a second Ctrl-C raises
    ``KeyboardInterrupt`` at once. Returns how the run ended (last metrics, checkpoint).
    """
    result = RunResult(run_dir_of(job).resolve(), job.steps)
    session = open_session(job, reporter, result)
    if session is None:  # already complete: the closing lines still offer export and resume
        result.checkpoint = latest_checkpoint(run_dir_of(job) / CHECKPOINTS)
        return result
    try:
        session.tracker.status("starting Ray workers and loading the model")
        # after Ray's own SIGTERM handler: ours replaces it
        init_ray(job.resources.ray_address, cpu_threads=local_cpu_threads(job))
        with StopOnSignal() as session.signals, running_workers(job) as workers:
            train_loop(session, workers, result)
    finally:
        session.evaluator.close()  # in-driver reward pools' verifier children
        session.tracker.close()
    result.checkpoint = session.checkpoints.latest()  # reuses this run's verification results
    return result


def train_loop(s: Session, workers: Workers, result: RunResult) -> None:
    """The RL loop: rollout → rewards → reference → trainer logprobs → mismatch → advantages →
    update → publish weights, one step at a time (DESIGN.md §5). Fills ``result``."""
    job, tokenizer = s.job, s.tokenizer
    calibrate_kv_cache(workers, job, s.feed)
    sync(workers, reference=True)  # version 0: engines (and the reference) hold the trainer's codes
    if s.resume:  # trainer state, data cursor, RNG; the reference keeps the initial policy
        s.checkpoints.restore(s.resume, workers.stateful, s.sampler)
        sync(workers)
    if s.reporter:
        s.reporter.started(
            quant_fingerprint=job.precision.quant.fingerprint(), run_dir=str(run_dir_of(job))
        )
    metrics, done, stopped = {}, s.start, False
    health = HealthGuard(job.health, vocab_size=len(tokenizer), start=s.start)
    result.steps_done = s.start
    for index in range(s.start, job.steps):  # index: 0-based (seeds); step: 1-based (shown)
        step = index + 1
        s.tracker.status(f"step {step} running")
        timer = PhaseTimer()
        with timer("rollout"):
            rollouts = collect(job, s.feed, workers.rollout, workers.reward, tokenizer, step=index)
        health.check_rewards(step, rollouts.rewards)  # a NaN never reaches the update
        workers.release_engines()  # colocated: the trainer ranks get the engines' memory
        batch = new_batch(rollouts, job, pad_id=tokenizer.pad_token_id or 0)
        with timer("ref"):
            batch.ref_logp = reference_logprobs(workers, batch)
        with timer("old_logp"):
            batch.old_logp = trainer_logprobs(workers, batch, job)
        with timer("values"):
            values = critic_values(workers, batch, job)
        mismatch = mismatch_metrics(batch.old_logp, batch.rollout_logp, batch.packed.response_mask)
        batch.advantages, returns = advantages(job, rollouts, batch, values)
        with timer("train"):
            train_metrics = train(workers, batch, job, returns=returns, values=values)
        with timer("sync"):
            workers.resume_engines()
            version = sync(workers)
        attribution = {}
        if attribution_due(job.logging.mismatch_attribution_every, step):
            with timer("attribution"):
                attribution = measure_attribution(job, workers, rollouts, step)
        metrics = step_metrics(rollouts, batch, mismatch, train_metrics, timer, version=version)
        metrics |= attribution
        log_step(s.tracker, step, metrics, rollouts, batch)
        verdict = health.check_step(step, metrics, batch.advantages)  # RunUnhealthy: FAILED
        if s.evaluator.due(index):
            metrics |= evaluate(s, workers, index)
        done = step
        result.steps_done, result.metrics = done, metrics
        if result.reward_first is None and index == 0:
            result.reward_first = metrics.get("reward/mean")
        s.checkpoints.maybe_save(done, workers.stateful, s.sampler, healthy=verdict.healthy)
        if s.reporter:
            s.reporter.step(done, metrics)  # completed steps: 1 after the first, as everywhere
        if done < job.steps and s.stop_requested():
            log.info("stop requested: stopping after step %d of %d", done, job.steps)
            stopped = True
            break
    result.stopped = stopped
    result.stop_signal = s.signals.signum if stopped and s.signals else None
    healthy = health.last_healthy_step == done  # a later checkpoint never replaces the healthy one
    s.checkpoints.finish(done, workers.stateful, s.sampler, stopped=stopped, healthy=healthy)


def sync(workers: Workers, *, reference: bool = False) -> int:
    """Weight sync trainer → engines (and the reference, at version 0); the new version."""
    refs = workers.references if reference else None
    return sync_weights(
        workers.trainers, workers.rollout, reference=refs, transport=workers.transport
    )


def open_session(job: JobSpec, reporter: Any, result: RunResult) -> Session | None:
    """Check the spec, resolve resume, prepare the run directory, data and tracking (no Ray yet).

    Sets ``result.steps_done`` to the steps the resumed checkpoint completed. Returns None when
    a resumed run has nothing left to do (``result.nothing_to_do``).
    """
    convert_gguf_in_child(job.model.path)  # a first run's conversion: not in the driver's memory
    preflight(job, local=True)  # unimplemented options, missing files: fail before anything starts
    for warning in spec_warnings(job):  # runs, but may not learn (bf16 master with a small lr)
        log.warning("%s", warning)
    lock_run_dir(job)  # a live run of the same name would crash if its directory moved
    checkpoints = Checkpointer(run_dir_of(job), job)
    try:
        resume = checkpoints.resolve()  # refuses a checkpoint of another quant contract up front
    except CheckpointCorruptError as exc:
        raise ResumeRefused(str(exc)) from exc
    start = result.steps_done = checkpoint_step(resume)  # steps already done (0: a fresh start)
    if start >= job.steps:
        log.warning(
            "%s already completed %d of %d steps: nothing to run (set checkpoint.resume=never "
            "to start over, or raise steps)",
            run_dir_of(job),
            start,
            job.steps,
        )
        result.nothing_to_do = True
        return None
    # the whole dataset and one rendered prompt before the run directory is touched: a bad row
    # past preflight's first records must not move an earlier run aside (or prune one)
    tokenizer = load_tokenizer(resolve_model(job.model.path, load_weights=False).tokenizer_dir)
    sampler = PromptSampler(
        build_dataset(job.data.train),
        batch_size=job.data.prompts_per_step,
        shuffle=job.data.shuffle,
        seed=job.seed,
    )
    feed = PromptFeed(sampler, tokenizer, job)
    feed.peek(1)  # a bad template or field fails here too, before Ray starts
    run_dir = prepare_run_dir(job, fresh=resume is None)
    log.info("run directory: %s", run_dir.resolve())
    tracker = Tracker(
        run_dir,
        job.logging,
        config=job.model_dump(mode="json"),
        total_steps=job.steps,
        start_step=start,
    )
    return Session(
        job,
        tracker,
        checkpoints,
        resume,
        start,
        tokenizer,
        sampler,
        feed,
        Evaluator(job, tokenizer),
        reporter,
    )


def evaluate(s: Session, workers: Workers, index: int) -> dict[str, float]:
    """Held-out evaluation with the rollout engines after step ``index + 1``; logged with rows."""
    s.tracker.status(f"step {index + 1}: evaluating")
    metrics, rows = s.evaluator.run(index, workers.rollout, workers.reward)
    s.tracker.log_validation(index + 1, metrics, rows[: s.job.logging.log_generations])
    return metrics


def measure_attribution(job: JobSpec, workers: Workers, rollouts: Any, step: int) -> dict:
    """``mismatch/attrib/*`` of the just-updated policy on this step's first prompts."""
    import ray

    weights = workers.trainer.model_weights
    weights = ray.get(weights.remote()) if hasattr(weights, "remote") else weights()
    prompts = [s.prompt_token_ids for s in rollouts.samples[:: job.rollout.n]]
    return attribution_metrics(job, weights, prompts, step=step)


def log_step(
    tracker: Tracker, step: int, metrics: dict[str, float], rollouts: Any, batch: Any
) -> None:
    """Metrics, sample generations and the mismatch-by-position curve of a step."""
    tracker.log(step, metrics)
    tracker.log_generations(step, generation_rows(rollouts, tracker.spec.log_generations))
    mask = batch.packed.response_mask
    tracker.log_curve(
        step, "mismatch_by_position", mismatch_by_position(batch.old_logp, batch.rollout_logp, mask)
    )


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

    Exit codes: 0 done (or nothing left to do), 2 a user error (bad spec, missing file,
    unsupported option, no checkpoint to resume that passes verification), 1 any other failure
    (traceback in the log), 130 stopped by Ctrl-C (143 by SIGTERM): at once, or after a step
    with a checkpoint (``RunResult.exit_code``; a stop through the API exits 0)."""
    from fp8rl.services.store.reporter import reporter_from_env

    args = sys.argv[1:] if argv is None else argv
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    if not args or args[0] in ("-h", "--help"):
        print(main.__doc__)
        return 0 if args else 2
    reporter = reporter_from_env()
    if reporter:  # the driver's log lines reach `fp8rl runs logs` / GET /runs/{id}/logs
        logging.getLogger().addHandler(reporter.log_handler())
    try:
        job = load_job_spec(Path(args[0]), args[1:])
    except SpecError as exc:
        print(exc, file=sys.stderr)
        if reporter:
            reporter.finished(RunState.FAILED, str(exc))
        return 2
    torch.manual_seed(job.seed)
    try:
        result = run(job, reporter=reporter)
    except KeyboardInterrupt:
        print(
            f"interrupted: run stopped at once; `{continue_command(args[0], args[1:])}` "
            "continues from the last checkpoint, if one was written",
            file=sys.stderr,
        )
        if reporter:
            reporter.finished(RunState.STOPPED, "interrupted (Ctrl-C / SIGINT)")
        return 130
    except Exception as exc:  # the run failed: say why, once
        cause = getattr(exc, "cause", None) or exc  # a worker's error arrives wrapped by Ray
        init_error = actor_init_user_error(cause) or actor_init_user_error(exc)
        user_error = isinstance(cause, USER_ERRORS) or init_error is not None
        oom = oom_message(exc)  # Ray's 20-line memory-monitor report, in one line
        if not user_error and oom is None:  # a bug: keep the traceback in the log
            log.exception("run failed")
        named = f"{type(cause).__name__}: {cause}"  # a spec's problems name their fields already
        reason = oom or init_error or (str(cause) if isinstance(cause, SpecError) else named)
        if reporter:
            reporter.finished(RunState.FAILED, reason)
        print(f"run failed: {reason}", file=sys.stderr)
        return 2 if user_error else 1
    if reporter:
        reporter.finished(RunState.STOPPED if result.stopped else RunState.SUCCEEDED)
    print("\n".join(closing_lines(result, spec=args[0], overrides=args[1:])), file=sys.stderr)
    return result.exit_code


if __name__ == "__main__":
    sys.exit(main())
