"""Run directories: an earlier run is moved aside, and only ``keep_previous_runs`` are kept;
a failed start (no step, no checkpoint) is replaced, so it never pushes a good run out."""

from __future__ import annotations

import pytest

from fp8rl.protocol import SpecError, parse_job_spec
from fp8rl.services.run_dir import prepare_run_dir, prune_previous_runs


def _fill(path, text):
    path.mkdir(parents=True, exist_ok=True)
    (path / "metrics.jsonl").write_text(text)


def test_fresh_run_moves_the_earlier_one_aside_and_keeps_one_by_default(tmp_path):
    job = parse_job_spec("", [f"output_dir={tmp_path}", "name=qs"])
    assert job.keep_previous_runs == 1
    _fill(tmp_path / "qs.previous-20260101-000000", "oldest")
    _fill(tmp_path / "qs", "last")
    prepare_run_dir(job, fresh=True)
    previous = sorted(p.name for p in tmp_path.glob("qs.previous-*"))
    assert len(previous) == 1 and previous[0] != "qs.previous-20260101-000000"
    assert (tmp_path / previous[0] / "metrics.jsonl").read_text() == "last"
    assert not (tmp_path / "qs" / "metrics.jsonl").exists()


def test_keep_zero_deletes_the_earlier_run(tmp_path):
    job = parse_job_spec("", [f"output_dir={tmp_path}", "name=qs", "keep_previous_runs=0"])
    _fill(tmp_path / "qs", "last")
    prepare_run_dir(job, fresh=True)
    assert list(tmp_path.glob("qs.previous-*")) == []


def test_prune_keeps_the_newest_by_time_in_the_name_and_ignores_other_runs(tmp_path):
    for stamp in ("20260101-000000", "20260301-000000", "20260201-000000"):
        _fill(tmp_path / f"qs.previous-{stamp}", stamp)
    _fill(tmp_path / "other.previous-20250101-000000", "x")
    removed = prune_previous_runs(tmp_path / "qs", keep=2)
    assert [p.name for p in removed] == ["qs.previous-20260101-000000"]
    assert (tmp_path / "other.previous-20250101-000000").exists()


def _good_run(path):
    """A run that completed steps and saved a checkpoint."""
    _fill(path, '{"step": 1}\n{"step": 2}\n')
    (path / "job.yaml").write_text("name: qs\n")
    (path / "checkpoints" / "step_2").mkdir(parents=True)


def test_failed_starts_never_delete_the_previous_good_run(tmp_path):
    job = parse_job_spec("", [f"output_dir={tmp_path}", "name=qs"])
    _good_run(tmp_path / "qs")
    prepare_run_dir(job, fresh=True)  # attempt 1: moves the good run aside, then fails
    prepare_run_dir(job, fresh=True)  # attempt 2: the failed start is replaced, not rotated
    (previous,) = tmp_path.glob("qs.previous-*")
    assert (previous / "checkpoints" / "step_2").is_dir()
    assert (tmp_path / "qs" / "job.yaml").is_file()


def test_a_failed_start_is_replaced_with_a_log_line(tmp_path, caplog):
    job = parse_job_spec("", [f"output_dir={tmp_path}", "name=qs"])
    prepare_run_dir(job, fresh=True)
    _fill(tmp_path / "qs", "")  # the tracker's empty metrics.jsonl: no step completed
    prepare_run_dir(job, fresh=True)
    assert list(tmp_path.glob("qs.previous-*")) == []
    assert "held a failed start (no step completed, no checkpoint): removed it" in caplog.text


def test_keep_previous_runs_counts_only_runs_that_did_something(tmp_path):
    _good_run(tmp_path / "qs.previous-20260101-000000")
    empty = tmp_path / "qs.previous-20260201-000000"  # a failed start left by an older release
    _fill(empty, "")
    (empty / "job.yaml").write_text("name: qs\n")
    removed = prune_previous_runs(tmp_path / "qs", keep=1)
    assert removed == [empty]
    assert (tmp_path / "qs.previous-20260101-000000" / "checkpoints").is_dir()


def test_a_directory_that_is_not_a_run_is_moved_aside_not_deleted(tmp_path):
    job = parse_job_spec("", [f"output_dir={tmp_path}", "name=qs"])
    (tmp_path / "qs").mkdir()
    (tmp_path / "qs" / "notes.txt").write_text("mine")  # no job.yaml: not written by fp8rl
    prepare_run_dir(job, fresh=True)
    (previous,) = tmp_path.glob("qs.previous-*")
    assert (previous / "notes.txt").read_text() == "mine"


def test_pruning_never_touches_another_run_whose_name_starts_the_same(tmp_path):
    """``exp.previous-live`` / ``exp.previous-zfinal`` are not runs ``exp`` moved aside: a live
    one was deleted as "a failed start", a finished one sorted as the newest."""
    live = tmp_path / "exp.previous-live"
    _fill(live, "")  # a run in its first step: an empty metrics.jsonl
    (live / "job.yaml").write_text("name: exp.previous-live\n")
    _good_run(tmp_path / "exp.previous-zfinal")
    _good_run(tmp_path / "exp.previous-20260101-000000")
    _good_run(tmp_path / "exp.previous-20260201-000000")
    removed = prune_previous_runs(tmp_path / "exp", keep=1)
    assert [p.name for p in removed] == ["exp.previous-20260101-000000"]
    assert live.is_dir() and (tmp_path / "exp.previous-zfinal").is_dir()


def test_a_run_name_cannot_take_the_suffix_of_earlier_runs():
    with pytest.raises(SpecError, match=r"name: must not contain '\.previous-'"):
        parse_job_spec("", ["name=exp.previous-live"])
