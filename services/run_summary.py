"""The closing lines of a run: where it is, how it ended, and the commands to run next."""

from __future__ import annotations

import shlex
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path

FINAL_KEYS = (
    "reward/mean",
    "response_length/mean",
    "mismatch/token_mult_prob_error",
    "mismatch/abs_dlogp_max",
    "actor/grad_norm",
    "timing_s/step",
)


@dataclass
class RunResult:
    """How ``driver.run`` ended.

    ``steps_done``: steps completed (1-based count); ``stopped``: ended early on a stop request
    (Ctrl-C, SIGTERM, ``fp8rl runs stop``); ``stop_signal``: the signal that requested it (None
    for a stop through the API); ``nothing_to_do``: a resumed run had already completed
    ``steps_done`` >= ``total_steps`` steps and ran none; ``checkpoint``: the newest complete
    checkpoint, if any; ``metrics``: the last step's metrics.
    """

    run_dir: Path
    total_steps: int
    steps_done: int = 0
    stopped: bool = False
    stop_signal: int | None = None
    nothing_to_do: bool = False
    checkpoint: Path | None = None
    metrics: dict[str, float] = field(default_factory=dict)
    reward_first: float | None = None

    @property
    def exit_code(self) -> int:
        """0, or ``128 + stop_signal`` when a signal stopped the run before its last step (130
        after Ctrl-C, the shell's code for a process ended by SIGINT): a script tells a stopped
        run from a finished one. A stop through the API exits 0 (its run state says STOPPED)."""
        return 128 + self.stop_signal if self.stopped and self.stop_signal else 0


def closing_lines(result: RunResult, *, spec: str, overrides: list[str]) -> list[str]:
    """Lines printed at the end of ``fp8rl run``: run directory, final metrics, next commands.

    ``spec``/``overrides``: the command line the run was started with (the resume command
    repeats them with ``checkpoint.resume=auto``, and raises ``steps`` for a finished run).
    """
    lines = [headline(result), f"run directory: {result.run_dir}"]
    shown = [f"{k} {result.metrics[k]:.4g}" for k in FINAL_KEYS if k in result.metrics]
    if shown:
        lines.append("final metrics (last step): " + "  ".join(shown))
    if (
        result.reward_first is not None
        and "reward/mean" in result.metrics
        and result.steps_done > 1
    ):
        lines.append(
            f"reward/mean: {result.reward_first:.3f} at step 1 -> "
            f"{result.metrics['reward/mean']:.3f} at step {result.steps_done}"
        )
    run_dir, cli = shlex.quote(str(result.run_dir)), fp8rl_command()
    lines += ["next:", f"  {cli} report {run_dir}                 # plots and a summary"]
    if result.checkpoint is not None:
        lines.append(f"  {cli} export {run_dir} --format hf-bf16  # a Hugging Face model")
        lines.append(f"  {resume_command(result, spec=spec, overrides=overrides)}  # resume")
    else:
        lines.append("  (no checkpoint was written: export and resume need checkpoint.save_final)")
    return lines


def headline(result: RunResult) -> str:
    """The first closing line: how the run ended, in steps."""
    if result.nothing_to_do:
        return (
            f"nothing to do: the run already completed {result.steps_done} steps "
            f"(steps={result.total_steps})"
        )
    state = "stopped early" if result.stopped else "finished"
    return f"run {state} after {result.steps_done} of {result.total_steps} steps"


def resume_command(result: RunResult, *, spec: str, overrides: list[str]) -> str:
    """``fp8rl run`` continuing from the newest checkpoint (more steps when the run finished)."""
    dropped = ("checkpoint.resume=",) if result.stopped else ("checkpoint.resume=", "steps=")
    kept = [o for o in overrides if not o.startswith(dropped)]
    more = [] if result.stopped else [f"steps={max(result.total_steps, result.steps_done) * 2}"]
    return continue_command(spec, [*kept, *more])


def continue_command(spec: str, overrides: list[str]) -> str:
    """``fp8rl run SPEC OVERRIDES checkpoint.resume=auto``, shell-quoted (any earlier
    ``checkpoint.resume=`` override replaced)."""
    kept = [o for o in overrides if not o.startswith("checkpoint.resume=")]
    words = ["run", spec, *kept, "checkpoint.resume=auto"]
    return " ".join([fp8rl_command(), *(shlex.quote(w) for w in words)])


def fp8rl_command() -> str:
    """How to call the CLI again: ``fp8rl`` when that is on PATH, else the path it was started
    by (``.venv/bin/fp8rl`` after ``deploy/setup.sh``, which does not change PATH)."""
    started = sys.argv[0] if sys.argv and sys.argv[0].endswith("fp8rl") else None
    if shutil.which("fp8rl") or started is None:
        return "fp8rl"
    return shlex.quote(started)
