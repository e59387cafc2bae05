"""Checkpoint integrity (issue 17, rows 3, 4 and 8): checksums of every file, verification before
resume, fallback to the newest verified healthy checkpoint, pruning that keeps it, storage errors
that name the file and are not "user error"."""

from __future__ import annotations

import hashlib
import json
import logging
import os
from pathlib import Path

import pytest
import torch
import yaml
from test_checkpoint_files import SHARD, FakeTrainer, save, small_job
from typer.testing import CliRunner

from fp8rl.services import checkpoint_verify
from fp8rl.services.checkpoint import (
    LATEST,
    META,
    STATE_FILE,
    TRAINER_DIR,
    CheckpointCorruptError,
    CheckpointError,
    begin_checkpoint,
    commit_checkpoint,
    find_checkpoint,
    prune_checkpoints,
    read_meta,
    read_model_weights,
    select_checkpoint,
    verify_checkpoint,
)
from fp8rl.services.checkpoint_verify import hash_directory
from fp8rl.services.checkpointer import Checkpointer

MODEL_FILE = SHARD
"""The one rank's DCP weights file: what the damage below hits."""


def truncate(path: Path) -> str:
    with open(path / MODEL_FILE, "r+b") as f:
        f.truncate(100)
    return f"{MODEL_FILE} is 100 bytes"


def flip_byte(path: Path) -> str:
    """Same size, one byte changed deep in the tensor data (row 3: finite garbage)."""
    file = path / STATE_FILE
    data = bytearray(file.read_bytes())
    data[len(data) // 2] ^= 0x01
    file.write_bytes(bytes(data))
    return f"{STATE_FILE} fails its checksum"


def garbage_weights(path: Path) -> str:
    """Row 3: same-size finite noise over the middle half of the tensor data."""
    file = path / MODEL_FILE
    data = bytearray(file.read_bytes())
    start = len(data) // 4
    noise = torch.rand(len(data) // 8).numpy().tobytes()
    data[start : start + len(noise)] = noise
    file.write_bytes(bytes(data))
    return f"{MODEL_FILE} fails its checksum"


def remove_file(path: Path) -> str:
    (path / STATE_FILE).unlink()
    return f"{STATE_FILE} is missing"


def remove_manifest(path: Path) -> str:
    (path / META).unlink()
    return f"{META} is missing"


def garbage_manifest(path: Path) -> str:
    (path / META).write_bytes(b"\x00\xff{not json")
    return "is not valid JSON"


@pytest.fixture
def unreadable(monkeypatch):
    """chmod 000 on the weights; as root (which ignores modes) ``open`` also refuses them."""

    def damage(path: Path) -> str:
        target = path / MODEL_FILE
        target.chmod(0)
        if os.geteuid() == 0:

            def refuse(file, *args, **kwargs):
                if Path(file) == target:
                    raise PermissionError(13, "Permission denied", str(file))
                return open(file, *args, **kwargs)

            monkeypatch.setattr(checkpoint_verify, "open", refuse, raising=False)
        return f"{MODEL_FILE}: cannot read: Permission denied"

    yield damage


DAMAGES = [
    truncate,
    flip_byte,
    garbage_weights,
    remove_file,
    remove_manifest,
    garbage_manifest,
    "unreadable",
]


@pytest.mark.parametrize("damage", DAMAGES, ids=lambda d: d if isinstance(d, str) else d.__name__)
def test_a_damaged_checkpoint_is_skipped_with_path_and_reason_and_resume_falls_back(
    tmp_path, damage, request, caplog
):
    damage = request.getfixturevalue(damage) if isinstance(damage, str) else damage
    root = tmp_path / "checkpoints"
    good = save(root, 1)
    bad = save(root, 2)
    expected = damage(bad)
    with pytest.raises(CheckpointCorruptError, match=expected) as error:
        verify_checkpoint(bad)
    assert str(bad) in str(error.value) and not isinstance(error.value, ValueError)

    with caplog.at_level(logging.WARNING, logger="fp8rl.services.checkpoint"):
        checkpointer = Checkpointer(tmp_path, small_job())
        assert checkpointer.resolve() == good
    [skipped] = checkpointer.skipped
    assert skipped.path == bad and skipped.corrupt and expected in skipped.reason
    assert any(str(bad) in r.message and expected in r.message for r in caplog.records)
    [aside] = bad.parent.glob("step_2.unverified-*")  # moved aside, not deleted
    assert not bad.exists() and any(aside.name in r.message for r in caplog.records)

    class Trainer:
        def load(self, directory):
            self.directory = directory
            return 2

    class Sampler:
        def load_state_dict(self, cursor):
            self.cursor = cursor

    trainer = Trainer()
    assert checkpointer.restore(good, [trainer], Sampler()) == 1
    assert trainer.directory == good  # the ranks load step 1, not step 2


def test_every_file_of_the_step_directory_gets_size_and_sha256_in_the_manifest(tmp_path):
    tok = tmp_path / "tok"
    tok.mkdir()
    (tok / "tokenizer.json").write_text('{"a": 1}')
    path = save(tmp_path / "checkpoints", 3, tokenizer_dir=tok)
    files = json.loads((path / META).read_text())["files"]
    on_disk = sorted(
        p.relative_to(path).as_posix() for p in path.rglob("*") if p.is_file() and p.name != META
    )
    assert (
        sorted(files)
        == on_disk
        == sorted([SHARD, f"{TRAINER_DIR}/.metadata", STATE_FILE, "tokenizer/tokenizer.json"])
    )
    for rel, record in files.items():
        data = (path / rel).read_bytes()
        assert record == {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}


def test_shard_files_written_by_ranks_are_recorded_and_verified_like_any_file(tmp_path):
    root = tmp_path / "checkpoints"
    tmp = begin_checkpoint(root, 5)
    for rank in range(2):  # what torch.distributed.checkpoint ranks leave in the directory
        (tmp / f"__{rank}_0.distcp").write_bytes(os.urandom(4096))
    (tmp / ".metadata").write_bytes(b"dcp metadata")
    job = small_job()
    path = commit_checkpoint(
        root,
        tmp,
        step=5,
        job=job,
        policy_version=10,
        master_dtype="float32",
        data_cursor={"cursor": 0},
        model_config={},
        tokenizer_dir=None,
        healthy=True,
        started=0.0,
    )
    assert sorted(read_meta(path).files) == [".metadata", "__0_0.distcp", "__1_0.distcp"]
    assert verify_checkpoint(path).step == 5
    with open(path / "__1_0.distcp", "r+b") as f:
        f.seek(2048)
        f.write(b"\x00" * 8)
    with pytest.raises(CheckpointCorruptError, match=r"__1_0\.distcp fails its checksum"):
        verify_checkpoint(path)


def test_an_unhealthy_later_checkpoint_never_replaces_the_healthy_resume_point(tmp_path):
    root = tmp_path / "checkpoints"
    healthy = save(root, 1)
    sick = save(root, 2, healthy=False)
    assert read_meta(sick).healthy is False and read_meta(healthy).healthy is True
    assert (root / LATEST).read_text().strip() == "step_1"
    checkpointer = Checkpointer(tmp_path, small_job())
    assert checkpointer.resolve() == healthy
    assert [(s.path, s.corrupt) for s in checkpointer.skipped] == [(sick, False)]
    assert "healthy: false" in checkpointer.skipped[0].reason
    assert find_checkpoint(tmp_path) == healthy  # exports follow the same rule
    assert find_checkpoint(tmp_path, step=2) == sick  # unless a step is named


def _saver(tmp_path: Path, keep_last: int) -> tuple[Checkpointer, object, object]:
    checkpointer = Checkpointer(tmp_path, small_job(keep_last=keep_last))
    checkpointer._model = ({"hidden_size": 8}, None)
    sampler = type("S", (), {"state_dict": lambda self: {"cursor": 0}})()
    return checkpointer, [FakeTrainer()], sampler


def test_pruning_keeps_the_newest_healthy_checkpoint_through_unhealthy_saves(tmp_path):
    """Row 8: lr=1e3 collapsed the policy after step 1 and keep_last=2 pruned the good one."""
    checkpointer, trainer, sampler = _saver(tmp_path, keep_last=2)
    root = tmp_path / "checkpoints"
    checkpointer.save(1, trainer, sampler, healthy=True)
    for step in (2, 3, 4, 5):
        checkpointer.save(step, trainer, sampler, healthy=False)
    assert sorted(p.name for p in root.iterdir()) == [LATEST, "step_1", "step_4", "step_5"]
    assert (root / LATEST).read_text().strip() == "step_1"
    assert Checkpointer(tmp_path, small_job()).resolve() == root / "step_1"


def test_pruning_never_counts_damaged_checkpoints_towards_keep_last(tmp_path):
    root = tmp_path / "checkpoints"
    for step in (1, 2, 3, 4):
        save(root, step)
    truncate(root / "step_3")
    remove_manifest(root / "step_4")
    pruned = prune_checkpoints(root, keep_last=1, anchor=None)
    assert pruned.deleted == [root / "step_1"]  # step_2 is the newest verified one: kept
    assert [p.name.partition(".")[0] for p in pruned.set_aside] == ["step_4", "step_3"]
    assert sorted(p.name for p in root.iterdir() if ".unverified-" not in p.name) == [
        LATEST,
        "step_2",
    ]


def test_pruning_after_a_resume_keeps_the_verified_anchor_and_drops_older_damage(tmp_path):
    root = tmp_path / "checkpoints"
    for step in (1, 2, 3, 4):
        save(root, step)
    truncate(root / "step_1")  # damaged and older than the anchor: pruned like any old one
    flip_byte(root / "step_4")  # passes the size check only: moved aside at the resume
    checkpointer, trainer, sampler = _saver(tmp_path, keep_last=1)
    assert checkpointer.resolve() == root / "step_3"
    checkpointer.save(5, trainer, sampler, healthy=False)
    [aside] = root.glob("step_4.unverified-*")
    assert sorted(p.name for p in root.iterdir()) == [LATEST, "step_3", aside.name, "step_5"]
    assert select_checkpoint(root)[0] == root / "step_3"
    assert (root / LATEST).read_text().strip() == "step_3"  # no longer the pruned step_4


def test_undecodable_data_behind_a_matching_manifest_names_the_file_as_a_storage_error(tmp_path):
    """Row 4: random bytes in a weights file gave a decoder error with no path."""
    path = save(tmp_path / "checkpoints", 1)
    (path / TRAINER_DIR / ".metadata").write_bytes(b"\xff" * 64)
    meta = read_meta(path)
    meta.files = hash_directory(path, exclude=(META,))  # a buggy writer hashed its garbage
    (path / META).write_text(meta.model_dump_json())
    with pytest.raises(CheckpointCorruptError, match=f"{path / TRAINER_DIR}: cannot load"):
        read_model_weights(path)


def test_a_manifest_without_checksums_is_refused_with_its_format_version(tmp_path):
    path = save(tmp_path / "checkpoints", 1)
    meta = json.loads((path / META).read_text())
    meta["format_version"] = 1
    meta["files"] = {rel: rec["size"] for rel, rec in meta["files"].items()}
    (path / META).write_text(json.dumps(meta))
    with pytest.raises(CheckpointCorruptError, match="format_version 1"):
        verify_checkpoint(path)


def test_nothing_to_resume_from_is_a_user_error_but_damage_is_not(tmp_path):
    with pytest.raises(CheckpointError, match="no complete checkpoint"):
        find_checkpoint(tmp_path / "nowhere")
    with pytest.raises(CheckpointError, match="does not exist"):  # a typo, not damage
        find_checkpoint(tmp_path / "nowhere" / "checkpoints" / "step_3")
    save(tmp_path / "sick" / "checkpoints", 1, healthy=False)
    with pytest.raises(CheckpointError, match=r"no healthy checkpoint .* healthy: false"):
        find_checkpoint(tmp_path / "sick")
    assert Checkpointer(tmp_path / "sick", small_job()).resolve() is None  # auto: start over
    bad = save(tmp_path / "run" / "checkpoints", 1)
    flip_byte(bad)
    with pytest.raises(CheckpointCorruptError, match=f"step_1: {STATE_FILE} fails"):
        find_checkpoint(tmp_path / "run")
    assert issubclass(CheckpointCorruptError, OSError)
    assert not issubclass(CheckpointCorruptError, ValueError)


def _spec(tmp_path: Path, **checkpoint) -> Path:
    job = small_job(**checkpoint)
    data = job.model_dump(mode="json")
    data.update(steps=1, output_dir=str(tmp_path / "runs"), name="r")
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump(data))
    return spec


def test_fp8rl_run_shows_the_skipped_checkpoint_and_its_reason(tmp_path, caplog):
    """`fp8rl run` with resume: auto logs which checkpoint was skipped and why (stderr, and
    `fp8rl runs logs` through the reporter's log handler), then resumes from the older one (here
    step 1 of steps=1: nothing is left to run, so Ray never starts)."""
    from fp8rl.services.cli import app

    spec = _spec(tmp_path)
    root = tmp_path / "runs" / "r" / "checkpoints"
    save(root, 1)
    bad = save(root, 2)
    flip_byte(bad)
    with caplog.at_level(logging.INFO):
        result = CliRunner().invoke(app, ["run", str(spec)])
    assert result.exit_code == 0, result.output
    logged = [r.getMessage() for r in caplog.records]
    assert f"skipping checkpoint {bad}: {STATE_FILE} fails its checksum" in "\n".join(logged)
    assert any("already completed 1 of 1 steps" in m for m in logged)
    # the closing lines offer the export and the resume of the verified checkpoint
    assert "--format hf-bf16" in result.output and "no checkpoint was written" not in result.output


def test_verification_cost_is_paid_once_per_resume(tmp_path, monkeypatch):
    root = tmp_path / "checkpoints"
    save(root, 1)
    calls = []
    real = checkpoint_verify.hash_file
    monkeypatch.setattr(checkpoint_verify, "hash_file", lambda p: calls.append(p) or real(p))
    checkpointer = Checkpointer(tmp_path, small_job())
    path = checkpointer.resolve()
    trainer = type("T", (), {"load": lambda self, d: 0})()
    sampler = type("S", (), {"load_state_dict": lambda self, c: None})()
    checkpointer.restore(path, [trainer], sampler)
    assert sorted(p.name for p in calls) == sorted([".metadata", Path(SHARD).name, STATE_FILE])


def test_fp8rl_export_of_a_damaged_checkpoint_exits_2_naming_the_file(tmp_path):
    from fp8rl.services.cli import app

    bad = save(tmp_path / "checkpoints", 1)
    flip_byte(bad)
    result = CliRunner().invoke(app, ["export", str(tmp_path), "--out", str(tmp_path / "x")])
    assert result.exit_code == 2  # the person picks another step or restores the file
    assert f"{STATE_FILE} fails its checksum" in result.output and "step_1" in result.output
    assert not (tmp_path / "x").exists()


def test_resume_auto_with_only_damaged_checkpoints_refuses_and_changes_nothing(tmp_path):
    root = tmp_path / "checkpoints"
    bad = save(root, 1)
    truncate(bad)
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    with pytest.raises(CheckpointCorruptError, match="nothing was changed") as error:
        Checkpointer(tmp_path, small_job()).resolve()
    assert "step_1" in str(error.value) and "checkpoint.resume=never" in str(error.value)
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before


@pytest.mark.parametrize(
    "make",
    [
        lambda root: (root / "step_3").mkdir(parents=True),  # a save that never finished
        lambda root: (
            (root / "step_3").mkdir(parents=True)
            or (root / "step_3" / "meta.json").write_text("{not json")
        ),
        lambda root: None,  # no checkpoint at all
    ],
    ids=["meta-missing", "meta-not-json", "nothing"],
)
def test_fp8rl_export_of_a_missing_or_malformed_checkpoint_exits_2(tmp_path, make):
    from fp8rl.services.cli import app

    make(tmp_path / "checkpoints")
    result = CliRunner().invoke(app, ["export", str(tmp_path), "--out", str(tmp_path / "x")])
    assert result.exit_code == 2, result.output
    assert "export failed" in result.output
    assert not (tmp_path / "x").exists()


def test_a_named_checkpoint_moved_aside_is_refused_and_a_renamed_one_is_corrupt(tmp_path):
    root = tmp_path / "checkpoints"
    aside = save(root, 1).rename(root / "step_1.unverified-20261205-101500")
    with pytest.raises(CheckpointError, match="moved aside for failing verification"):
        find_checkpoint(aside)  # even though its files verify now
    renamed = save(root, 2).rename(root / "step_7")
    with pytest.raises(CheckpointCorruptError, match="records step 2"):
        find_checkpoint(renamed)
    assert find_checkpoint(save(root, 3)) == root / "step_3"


def test_validate_refuses_a_resume_target_whose_sizes_fail_and_leaves_hashing_to_the_run(tmp_path):
    from fp8rl.services.preflight import resume_problems

    root = tmp_path / "run" / "checkpoints"
    good, cut, flipped = save(root, 1), save(root, 2), save(tmp_path / "other", 3)
    truncate(cut)
    flip_byte(flipped)  # same size: only the run's sha256 check sees it
    assert resume_problems(str(good)) == []
    (problem,) = resume_problems(str(cut))
    assert problem.startswith(f"checkpoint.resume: '{cut}' fails verification") and (
        MODEL_FILE in problem
    )
    assert resume_problems(str(root.parent)) == []  # the run resumes from step_1, intact
    assert resume_problems(str(flipped)) == []
    truncate(good)
    (problem,) = resume_problems(str(root.parent))
    assert "holds no checkpoint that passes verification" in problem
    assert "step_2: " in problem and "step_1: " in problem
