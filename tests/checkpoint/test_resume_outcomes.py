"""What `fp8rl run ... checkpoint.resume=...` says and returns when there is nothing to resume
from (every checkpoint damaged: exit 2, the message alone) or nothing left to run (a truthful
closing line, exit 0). Ray never starts: the driver stops before it."""

from __future__ import annotations

import logging
from pathlib import Path

import yaml
from test_checkpoint_files import SHARD, save, small_job

from fp8rl.services.driver import main


def _spec(tmp_path: Path, *, steps: int, resume: str) -> Path:
    data = small_job(resume=resume).model_dump(mode="json")
    data.update(steps=steps, output_dir=str(tmp_path / "runs"), name="r")
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump(data))
    return spec


def _truncate(checkpoint: Path) -> None:
    with open(checkpoint / SHARD, "r+b") as f:
        f.truncate(100)


def _checkpoints(tmp_path: Path) -> Path:
    return tmp_path / "runs" / "r" / "checkpoints"


def test_resume_auto_with_every_checkpoint_damaged_exits_2_without_a_traceback(
    tmp_path, capsys, caplog
):
    for step in (9, 10):
        _truncate(save(_checkpoints(tmp_path), step))
    with caplog.at_level(logging.INFO):
        code = main([str(_spec(tmp_path, steps=12, resume="auto"))])
    err = capsys.readouterr().err
    assert code == 2, err
    assert "passes verification" in err and "step_10" in err and "step_9" in err
    assert "nothing was changed" in err and "checkpoint.resume=never" in err
    assert not [r for r in caplog.records if r.exc_info], "a traceback was logged"


def test_resume_from_a_named_damaged_checkpoint_exits_2_naming_the_file(tmp_path, capsys, caplog):
    bad = save(tmp_path / "elsewhere" / "checkpoints", 9)
    _truncate(bad)
    with caplog.at_level(logging.INFO):
        code = main([str(_spec(tmp_path, steps=12, resume=str(bad)))])
    err = capsys.readouterr().err
    assert code == 2, err
    assert str(bad) in err and "is 100 bytes" in err
    assert not [r for r in caplog.records if r.exc_info], "a traceback was logged"


def test_resume_of_a_run_past_its_steps_says_nothing_to_do_not_finished(tmp_path, capsys):
    """steps=5 on a run that completed 9: it printed `run finished after 5 of 5 steps`."""
    save(_checkpoints(tmp_path), 9)
    code = main([str(_spec(tmp_path, steps=5, resume="auto"))])
    err = capsys.readouterr().err
    assert code == 0, err
    assert "nothing to do: the run already completed 9 steps (steps=5)" in err
    assert "finished after" not in err
    assert "steps=18 checkpoint.resume=auto" in err  # the resume offered runs more than 9
