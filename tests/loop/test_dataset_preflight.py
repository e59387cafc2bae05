"""Dataset contents are checked before anything starts: ``fp8rl validate`` and ``fp8rl run``
refuse a directory that is no dataset, an empty file, a line that is not JSON or rows without the
spec's keys, naming the field, the file and the reason, before the run directory is touched."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fp8rl_testing import shared_path
from typer.testing import CliRunner

from fp8rl.protocol import FileDataset, SpecError, parse_job_spec
from fp8rl.services.cli import app
from fp8rl.services.data.files import probe_file_dataset
from fp8rl.services.preflight import preflight

GOOD_ROW = json.dumps({"question": "1+1?", "answer": "2"})


def _bad_dataset(tmp_path: Path, kind: str) -> Path:
    """A dataset path that cannot be used, of the kind the new-user trial tried."""
    if kind == "directory":
        (tmp_path / "rows").mkdir()
        return tmp_path / "rows"
    if kind == "math500":
        return shared_path("data", "math500", "test.jsonl")
    path = tmp_path / f"{kind}.jsonl"
    path.write_text("" if kind == "empty" else f"{GOOD_ROW}\nnot json\n")
    return path


@pytest.mark.parametrize(
    ("kind", "field", "reason"),
    [
        ("directory", "data.train.path", "is a directory but not a datasets.save_to_disk"),
        ("empty", "data.train.path", "has no rows"),
        ("not_json", "data.train.path", ":2: not valid JSON"),
        (
            "math500",
            "data.train.prompt_key",
            "has no field 'question' (prompt_key); fields: problem",
        ),
    ],
)
def test_validate_refuses_unusable_dataset_contents_naming_field_file_and_reason(
    repo, tmp_path, kind, field, reason
):
    path = _bad_dataset(tmp_path, kind)
    spec = str(repo / "deploy" / "jobs" / "gsm8k-smollm2.yaml")
    result = CliRunner().invoke(app, ["validate", spec, f"data.train.path={path}"])
    assert result.exit_code == 2, result.output
    line = next(line.strip() for line in result.output.splitlines() if reason in line)
    assert line.startswith(f"{field}: {path}"), line


def test_eval_datasets_are_checked_too(tmp_path):
    path = _bad_dataset(tmp_path, "empty")
    job = parse_job_spec("", [f"eval.datasets=[{{type: file, path: {path}}}]"])
    with pytest.raises(SpecError) as info:
        preflight(job, local=True)
    assert info.value.problems == [f"eval.datasets.0.path: {path} has no rows (an empty file?)"]


def test_the_probe_reads_only_the_first_rows(tmp_path):
    path = tmp_path / "big.jsonl"
    path.write_text(f"{GOOD_ROW}\n" * 100 + "not json\n")  # a bad row far down: found by the run
    probe_file_dataset(FileDataset(path=str(path)))


@pytest.mark.parametrize("bad_line", [2, 101])  # 101: past preflight's first records
def test_run_with_bad_data_leaves_the_earlier_run_untouched(repo, tmp_path, capsys, bad_line):
    from fp8rl.services.driver import main

    good = tmp_path / "quickstart"
    (good / "checkpoints" / "step_10").mkdir(parents=True)
    (good / "metrics.jsonl").write_text('{"step": 10}\n')
    garbage = tmp_path / "garbage.jsonl"
    garbage.write_text(f"{GOOD_ROW}\n" * (bad_line - 1) + "not json\n")
    code = main(
        [
            str(repo / "deploy" / "jobs" / "quickstart.yaml"),
            f"output_dir={tmp_path}",
            "model.path=random:tiny-llama",
            f"data.train={{type: file, path: {garbage}}}",
        ]
    )
    assert code == 2
    assert f"{garbage}:{bad_line}: not valid JSON" in capsys.readouterr().err
    assert (good / "checkpoints" / "step_10").is_dir()
    assert list(tmp_path.glob("quickstart.previous-*")) == []
