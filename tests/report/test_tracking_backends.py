"""Tracker backends: JSONL always, console heartbeat, TensorBoard, W&B offline, MLflow file store."""

from __future__ import annotations

import json
import sys
import time

import pytest

from fp8rl.protocol import LoggingSpec
from fp8rl.services import tracking
from fp8rl.services.tracking import Tracker, markdown_table, mlflow_name

ROWS = [
    {"prompt": "What is 2+2?", "response": "4 | four", "reward": 1.0},
    {"prompt": "What is 3+3?", "response": "7\nseven", "reward": 0.0},
]


def jsonl(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def write_steps(tracker: Tracker, steps: range) -> None:
    for step in steps:
        tracker.log(step, {"reward/mean": step / 10, "bad": float("nan"), "timing_s/step": 1.0})
        tracker.log_generations(step, ROWS)
        tracker.log_curve(step, "mismatch_by_position", [0.1 * step, 0.2])
        if step % 2 == 1:
            tracker.log_validation(step, {"val/arith/acc": 0.5, "val/arith/mean@4": 0.4}, ROWS)


def test_jsonl_is_always_written_and_resume_drops_rows_of_the_lost_steps(tmp_path):
    spec = LoggingSpec(backends=[])
    assert spec.backends == ["jsonl"]
    tracker = Tracker(tmp_path, spec, config={"name": "t"})
    write_steps(tracker, range(1, 5))  # the interrupted attempt logged steps 1..4
    tracker.close()
    resumed = Tracker(tmp_path, spec, config={"name": "t"}, start_step=2)  # checkpoint: 2 steps
    write_steps(resumed, range(3, 6))
    resumed.close()
    metrics = jsonl(tmp_path / "metrics.jsonl")
    train = [r["step"] for r in metrics if "reward/mean" in r]
    assert train == [1, 2, 3, 4, 5]
    assert metrics[0]["bad"] is None  # NaN is written as null, never as invalid JSON
    assert [r["step"] for r in jsonl(tmp_path / "curves.jsonl")] == [1, 2, 3, 4, 5]
    assert [r["step"] for r in jsonl(tmp_path / "validation.jsonl")] == [1, 1, 3, 3, 5, 5]
    assert len(jsonl(tmp_path / "generations.jsonl")) == 10
    info = json.loads((tmp_path / "run_info.json").read_text())
    assert [s["start_step"] for s in info["starts"]] == [0, 2]
    assert info["hardware"]["cpu_count"] >= 1


def test_console_heartbeat_speaks_when_nothing_was_printed(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(tracking, "HEARTBEAT_S", 0.3)
    tracker = Tracker(tmp_path, LoggingSpec(backends=["console"]), config={}, total_steps=3)
    tracker.status("loading the model")
    time.sleep(2.0)
    tracker.log(1, {"reward/mean": 0.5, "timing_s/step": 1.0})
    tracker.log_validation(1, {"val/arith/acc": 0.25}, ROWS)
    tracker.close()
    err = capsys.readouterr().err
    assert "loading the model" in err and "… loading the model (" in err
    assert "step 1: reward 0.500" in err
    assert "validation after step 1: val/arith/acc 0.25" in err and "validation samples" in err


def test_tensorboard_gets_scalars_and_tables_and_purges_lost_steps(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    spec = LoggingSpec(backends=["tensorboard"])
    tracker = Tracker(tmp_path, spec, config={"name": "t"})
    write_steps(tracker, range(1, 5))
    tracker.close()
    resumed = Tracker(tmp_path, spec, config={"name": "t"}, start_step=2)
    write_steps(resumed, range(3, 5))
    resumed.close()
    events = EventAccumulator(str(tmp_path / "tensorboard"), size_guidance={"scalars": 0}).Reload()
    assert [e.step for e in events.Scalars("reward/mean")] == [1, 2, 3, 4]
    assert [e.step for e in events.Scalars("val/arith/acc")] == [1, 3]
    assert "val_generations/text_summary" in events.Tags()["tensors"]


def test_wandb_offline_logs_metrics_and_generation_tables(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_SILENT", "true")
    spec = LoggingSpec(backends=["wandb"], wandb={"mode": "offline", "project": "fp8rl-test"})
    tracker = Tracker(tmp_path, spec, config={"name": "t", "seed": 1})
    write_steps(tracker, range(2))
    tracker.close()
    run_id = json.loads((tmp_path / "tracking.json").read_text())["wandb_run_id"]
    runs = list((tmp_path / "wandb").glob(f"offline-run-*-{run_id}"))
    assert len(runs) == 1 and (runs[0] / f"run-{run_id}.wandb").stat().st_size > 0
    tables = sorted(p.name for p in runs[0].glob("files/media/table/*.table.json"))
    assert any(n.startswith("val_generations_1") for n in tables)
    table = json.loads(next(runs[0].glob("files/media/table/val_generations_1*")).read_text())
    assert table["columns"] == ["prompt", "response", "reward"] and len(table["data"]) == 2
    again = Tracker(tmp_path, spec, config={"name": "t"}, start_step=2)  # resume: same run id
    again.close()
    assert json.loads((tmp_path / "tracking.json").read_text())["wandb_run_id"] == run_id


def test_mlflow_file_store_gets_metrics_and_tables(tmp_path):
    mlflow = pytest.importorskip("mlflow")
    spec = LoggingSpec(backends=["mlflow"])
    tracker = Tracker(
        tmp_path, spec, config={"name": "t", "seed": 1, "precision": {"mode": "bf16"}}
    )
    write_steps(tracker, range(2))
    tracker.close()
    run_id = json.loads((tmp_path / "tracking.json").read_text())["mlflow_run_id"]
    client = mlflow.MlflowClient(tracking_uri=f"file:{(tmp_path / 'mlruns').resolve()}")
    history = client.get_metric_history(run_id, "reward/mean")
    assert [(m.step, m.value) for m in history] == [(0, 0.0), (1, 0.1)]
    assert client.get_metric_history(run_id, "val/arith/mean_4")[0].value == 0.4
    assert client.get_run(run_id).data.params["precision.mode"] == "bf16"
    artifacts = {a.path for a in client.list_artifacts(run_id, "tables")}
    assert "tables/val_generations_step_1.json" in artifacts


def test_selecting_an_uninstalled_extra_is_a_user_error(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)  # what an absent package looks like
    with pytest.raises(
        ValueError, match=r"includes 'wandb' but the wandb package is not installed"
    ):
        Tracker(tmp_path, LoggingSpec(backends=["wandb"]), config={})


def test_tables_and_metric_names_are_escaped_for_each_backend():
    table = markdown_table(ROWS)
    assert "4 \\| four" in table and "7 seven" in table
    assert table.splitlines()[1] == "|---|---|---|"
    assert mlflow_name("val/gsm8k/mean@4") == "val/gsm8k/mean_4"
