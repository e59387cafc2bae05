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
        assert stop.requested and stop.signum == sig
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), sig)
    assert signal.getsignal(sig) is before


def test_a_signal_ignored_by_the_parent_stays_ignored():
    before = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        with StopOnSignal() as stop:
            assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
            os.kill(os.getpid(), signal.SIGINT)
            assert not stop.requested
    finally:
        signal.signal(signal.SIGINT, before)


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


def test_closing_lines_of_a_one_step_run_show_no_reward_change():
    result = _result(
        steps_done=1, total_steps=1, metrics={"reward/mean": 0.1875}, reward_first=0.1875
    )
    text = "\n".join(closing_lines(result, spec="q.yaml", overrides=[]))
    assert "run finished after 1 of 1 steps" in text and "->" not in text


def test_closing_lines_of_a_stopped_run_resume_the_same_steps():
    result = _result(steps_done=3, stopped=True, checkpoint=Path("/c/step_3"))
    text = "\n".join(closing_lines(result, spec="q.yaml", overrides=["steps=8"]))
    assert "run stopped early after 3 of 8 steps" in text
    assert "fp8rl run q.yaml steps=8 checkpoint.resume=auto" in text


def test_closing_lines_of_a_resume_with_nothing_left_to_run_say_so():
    """steps=5 on a run that completed 9 printed `run finished after 5 of 5 steps`."""
    result = _result(total_steps=5, steps_done=9, nothing_to_do=True, checkpoint=Path("/c/step_9"))
    text = "\n".join(closing_lines(result, spec="q.yaml", overrides=["steps=5"]))
    assert text.startswith("nothing to do: the run already completed 9 steps (steps=5)")
    assert "finished after" not in text
    assert "fp8rl run q.yaml steps=18 checkpoint.resume=auto" in text


@pytest.mark.parametrize(
    ("ending", "code"),
    [
        ({"stopped": True, "stop_signal": signal.SIGINT}, 130),  # Ctrl-C, then a checkpoint
        ({"stopped": True, "stop_signal": signal.SIGTERM}, 143),
        ({"stopped": True}, 0),  # `fp8rl runs stop`: the API's run state says STOPPED
        ({}, 0),
        ({"nothing_to_do": True, "steps_done": 9}, 0),
    ],
)
def test_a_run_stopped_by_a_signal_exits_like_one_killed_by_it(ending, code):
    """A graceful Ctrl-C stop exited 0, like a finished run; a Ctrl-C during startup 130."""
    assert _result(**ending).exit_code == code


def test_driver_exit_code_after_a_graceful_ctrl_c_stop_is_130(monkeypatch, capsys):
    from fp8rl_testing import REPO

    from fp8rl.services import driver

    stopped = _result(steps_done=1, total_steps=3, stopped=True, stop_signal=signal.SIGINT)
    monkeypatch.setattr(driver, "run", lambda job, reporter=None: stopped)
    assert driver.main([str(REPO / "deploy/jobs/quickstart.yaml"), "steps=3"]) == 130
    assert "run stopped early after 1 of 3 steps" in capsys.readouterr().err


def test_closing_lines_without_a_checkpoint_say_why_there_is_no_export():
    text = "\n".join(closing_lines(_result(), spec="q.yaml", overrides=[]))
    assert "fp8rl export" not in text and "checkpoint.save_final" in text


@pytest.mark.slow
def test_ctrl_c_during_a_run_stops_after_the_step_with_a_checkpoint(tmp_path):
    """A real driver on the tiny random Llama: SIGINT once while step 1 runs → exit 130 after
    that step (a stopped run, not a finished one), its checkpoint, and a closing line with the
    resume command."""
    import json
    import subprocess
    import sys
    import threading
    import time

    from fp8rl_testing import REPO

    command = [
        sys.executable, "-m", "fp8rl.services.driver", str(REPO / "deploy/jobs/quickstart.yaml"),
        "model.path=random:tiny-llama", "model.max_model_len=128", "data.max_prompt_tokens=64",
        "rollout.max_tokens=4", "data.prompts_per_step=2", "rollout.n=2", "steps=5",
        f"output_dir={tmp_path}", "logging.backends=[jsonl, console]",
    ]  # fmt: skip
    proc = subprocess.Popen(command, stderr=subprocess.PIPE, text=True, start_new_session=True)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(proc.stderr), daemon=True)
    reader.start()
    try:
        deadline = time.monotonic() + 300
        while not any("step 1 running" in x for x in lines) and time.monotonic() < deadline:
            assert proc.poll() is None, "".join(lines)[-3000:]
            time.sleep(0.2)
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=300)
        reader.join(timeout=10)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    err = "".join(lines)
    assert proc.returncode == 130, err[-3000:]
    run_dir = tmp_path / "quickstart"
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    last = rows[-1]["step"]
    assert 1 <= last < 5, err[-3000:]
    assert (run_dir / "checkpoints" / f"step_{last}").is_dir()
    assert f"run stopped early after {last} of 5 steps" in err
    assert "checkpoint.resume=auto" in err and "Ctrl-C again" in err


def test_next_commands_use_the_path_the_cli_was_started_by_when_fp8rl_is_not_on_path(
    monkeypatch,
):
    from fp8rl.services import run_summary

    monkeypatch.setattr(run_summary.shutil, "which", lambda name: None)
    monkeypatch.setattr(run_summary.sys, "argv", [".venv/bin/fp8rl", "run", "q.yaml"])
    assert run_summary.fp8rl_command() == ".venv/bin/fp8rl"
    monkeypatch.setattr(run_summary.shutil, "which", lambda name: "/usr/bin/fp8rl")
    assert run_summary.fp8rl_command() == "fp8rl"


def test_the_command_an_interrupted_run_prints_repeats_its_spec_and_overrides():
    from fp8rl.services.run_summary import continue_command

    command = continue_command("deploy/jobs/q.yaml", ["name=my run", "checkpoint.resume=never"])
    assert command.endswith("run deploy/jobs/q.yaml 'name=my run' checkpoint.resume=auto")
