"""Ctrl-C / SIGTERM: the first asks for a stop after the step, the second stops at once; the
closing lines name the run directory, the final metrics and the next commands."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from fp8rl.services.run_summary import RunResult, closing_lines
from fp8rl.services.stop_signal import StopOnSignal


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_first_signal_requests_a_stop_and_the_second_interrupts(sig):
    before = signal.getsignal(sig)
    with StopOnSignal() as stop:
        assert not stop.requested
        os.kill(os.getpid(), sig)
        assert stop.requested
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), sig)
    assert signal.getsignal(sig) is before


def _result(**kwargs) -> RunResult:
    base = {"run_dir": Path("/tmp/runs/quickstart"), "total_steps": 8, "steps_done": 8}
    return RunResult(**(base | kwargs))


def test_closing_lines_of_a_finished_run_name_report_export_and_resume_with_more_steps():
    result = _result(
        checkpoint=Path("/tmp/runs/quickstart/checkpoints/step_8"),
        metrics={"reward/mean": 0.9375, "timing_s/step": 20.0},
        reward_first=0.25,
    )
    text = "\n".join(closing_lines(result, spec="q.yaml", overrides=["steps=8", "name=x"]))
    assert "run finished after 8 of 8 steps" in text
    assert "run directory: /tmp/runs/quickstart" in text
    assert "reward/mean 0.9375" in text and "0.250 at step 1 -> 0.938 at step 8" in text
    assert "fp8rl report /tmp/runs/quickstart" in text
    assert "fp8rl export /tmp/runs/quickstart --format hf-bf16" in text
    assert "fp8rl run q.yaml name=x steps=16 checkpoint.resume=auto" in text


def test_closing_lines_of_a_stopped_run_resume_the_same_steps():
    result = _result(steps_done=3, stopped=True, checkpoint=Path("/c/step_3"))
    text = "\n".join(closing_lines(result, spec="q.yaml", overrides=["steps=8"]))
    assert "run stopped early after 3 of 8 steps" in text
    assert "fp8rl run q.yaml steps=8 checkpoint.resume=auto" in text


def test_closing_lines_without_a_checkpoint_say_why_there_is_no_export():
    text = "\n".join(closing_lines(_result(), spec="q.yaml", overrides=[]))
    assert "fp8rl export" not in text and "checkpoint.save_final" in text
