"""Run directories: an earlier run is moved aside, and only ``keep_previous_runs`` are kept."""

from __future__ import annotations

from fp8rl.protocol import parse_job_spec
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
