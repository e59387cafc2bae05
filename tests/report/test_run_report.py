"""``fp8rl report``: plots and summary from a real short quickstart run and from synthetic logs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from fp8rl.protocol import LoggingSpec
from fp8rl.services.cli import app
from fp8rl.services.report import PLOTS, RunData, spread, write_report
from fp8rl.services.tracking import Tracker

REPO = Path(__file__).resolve().parents[2]


def assert_real_png(path: Path) -> None:
    """A PNG that decodes to a picture with some ink on it (not blank)."""
    import matplotlib.image

    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", path
    pixels = matplotlib.image.imread(path)
    assert pixels.shape[0] > 200 and pixels.shape[1] > 300, (path, pixels.shape)
    assert float(pixels[..., :3].std()) > 0.02, f"{path.name} looks blank"


@pytest.fixture(scope="module")
def quickstart_run(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("runs")
    command = [
        sys.executable, "-m", "fp8rl.services.cli", "run",
        str(REPO / "deploy" / "jobs" / "quickstart.yaml"),
        "steps=2", "rollout.max_tokens=8", "model.path=random:tiny-llama", "precision.exact=false",
        f"output_dir={out}", "resources.ray_address=local", "logging.backends=[console,jsonl]",
    ]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=400)
    assert done.returncode == 0, done.stderr[-3000:]
    return out / "quickstart"


def test_report_renders_every_plot_and_the_summary_for_a_quickstart_run(quickstart_run):
    result = CliRunner().invoke(app, ["report", str(quickstart_run)])
    assert result.exit_code == 0, result.output
    report = quickstart_run / "report"
    for name in PLOTS:
        assert_real_png(report / name)
    markdown = (report / "report.md").read_text()
    fingerprint = (quickstart_run / "quant_fingerprint").read_text().strip()
    assert fingerprint in markdown and "unified_fp8" in markdown
    assert "| steps done / planned | 2 / 2 |" in markdown
    assert "mismatch/token_mult_prob_error" in markdown and "cpu_count" in markdown
    assert "step_2" in markdown  # the final checkpoint is listed
    html = (report / "report.html").read_text()
    assert html.count("data:image/png;base64,") == len(PLOTS)


def synthetic_run(run_dir: Path) -> None:
    tracker = Tracker(run_dir, LoggingSpec(backends=[]), config={"name": "synthetic"})
    for step in range(6):
        tracker.log(
            step,
            {
                "reward/mean": step / 5,
                "reward/std": 0.1,
                "response_length/mean": 10 + step,
                "mismatch/token_mult_prob_error": 1.0 + step / 100,
                "timing_s/rollout": 1.0,
                "timing_s/train": 2.0,
                "timing_s/step": 3.1,
                "perf/tokens_per_s": 100.0 + step,
            },
        )
        tracker.log_curve(step, "mismatch_by_position", [0.01 * step * i for i in range(12)])
        if step % 2:
            tracker.log_validation(step, {"val/arith/acc": step / 10}, [{"q": "1+1", "a": "2"}])
    tracker.close()
    (run_dir / "job.yaml").write_text("name: synthetic\nsteps: 8\n")


def test_rows_of_one_step_merge_and_later_values_win(tmp_path):
    synthetic_run(tmp_path)
    with open(tmp_path / "metrics.jsonl", "a") as f:  # an attempt re-logged step 5
        f.write(json.dumps({"step": 5, "reward/mean": 0.75}) + "\n")
    data = RunData(tmp_path)
    assert [r["step"] for r in data.metrics] == list(range(6))
    assert data.series("reward/mean")[1][-1] == 0.75
    assert data.metrics[5]["response_length/mean"] == 15  # training row kept next to val
    assert data.series("val/arith/acc") == ([1, 3, 5], [0.1, 0.3, 0.5])


def test_report_of_synthetic_logs_has_validation_and_says_what_is_missing(tmp_path):
    synthetic_run(tmp_path)
    out = write_report(tmp_path)
    for name in PLOTS:
        assert_real_png(out / name)
    markdown = (out / "report.md").read_text()
    assert "| val/arith/acc | 0.5 |" in markdown
    assert "validation samples (step 5)" in markdown
    assert "| steps done / planned | 6 / 8 |" in markdown
    assert "| hardware |" not in markdown  # run_info.json was written by the tracker


def test_report_of_a_directory_without_metrics_is_a_user_error(tmp_path):
    result = CliRunner().invoke(app, ["report", str(tmp_path)])
    assert result.exit_code == 2 and "no metrics.jsonl" in result.output


def test_report_of_a_missing_directory_says_it_does_not_exist(tmp_path):
    result = CliRunner().invoke(app, ["report", str(tmp_path / "typo")])
    assert result.exit_code == 2 and "does not exist" in result.output


def test_report_to_an_out_that_cannot_be_a_directory_is_one_line_exit_1(tmp_path):
    (tmp_path / "run").mkdir()
    synthetic_run(tmp_path / "run")
    (tmp_path / "a-file").write_text("keep")
    for out in (tmp_path / "a-file", tmp_path / "a-file" / "report"):
        result = CliRunner().invoke(app, ["report", str(tmp_path / "run"), "--out", str(out)])
        assert result.exit_code == 1, result.output
        assert f"report failed: cannot write the report to {out}" in result.output
        assert "Traceback" not in result.output
    assert (tmp_path / "a-file").read_text() == "keep"


def test_position_curves_are_picked_evenly_including_first_and_last_step():
    assert spread([0, 1], 6) == [0, 1]
    assert spread(list(range(11)), 3) == [0, 5, 10]
    assert spread(list(range(100)), 6)[::5] == [0, 99]


def test_timing_plot_phases_are_disjoint_and_add_up_to_the_step_wall_time():
    from fp8rl.services.report import disjoint_phases

    rows = [
        {
            "step": 1,
            "timing_s/rollout": 4.0,
            "timing_s/rollout/generate": 3.0,  # part of rollout: not stacked again
            "timing_s/rollout/reward": 0.5,
            "timing_s/train": 2.0,
            "timing_s/step": 6.5,
        }
    ]
    phases = disjoint_phases(rows)
    assert set(phases) == {"rollout", "train", "other"}
    assert phases["other"] == [(1, 0.5)]
    assert sum(points[0][1] for points in phases.values()) == 6.5


def test_report_of_a_run_where_no_step_ran_is_a_user_error(tmp_path):
    tracker = Tracker(tmp_path, LoggingSpec(backends=[]), config={"name": "failed"})
    tracker.close()  # a start that failed before step 1: empty metrics.jsonl
    (tmp_path / "job.yaml").write_text("name: failed\nsteps: 8\n")
    result = CliRunner().invoke(app, ["report", str(tmp_path)])
    assert result.exit_code == 2 and "no step ran" in result.output
    assert not (tmp_path / "report").exists()


def test_the_reward_band_stays_within_each_steps_lowest_and_highest_reward(tmp_path, monkeypatch):
    import matplotlib.axes

    from fp8rl.services.report import plot_reward

    tracker = Tracker(tmp_path, LoggingSpec(backends=[]), config={"name": "band"})
    for step, (mean, std) in enumerate([(0.1, 0.3), (0.9, 0.3)]):
        tracker.log(step, {"reward/mean": mean, "reward/std": std, "reward/min": 0.0,
                           "reward/max": 1.0})  # fmt: skip
    tracker.close()
    bands = []
    monkeypatch.setattr(
        matplotlib.axes.Axes, "fill_between", lambda self, x, lo, hi, **kw: bands.append((lo, hi))
    )
    plot_reward(RunData(tmp_path), tmp_path / "reward.png")
    ((low, high),) = bands
    assert low == pytest.approx([0.0, 0.6]) and high == pytest.approx([0.4, 1.0])
