"""Pruning and resume around checkpoints that fail verification (new-user finding: a run resumed
past a corrupt ``step_9`` pruned the good ``step_8`` and kept the corrupt one), the abandoned
branch newer than the resume point, and re-saves of a step that are atomic.

Rule under test: a checkpoint that fails verification is never resumed from, never counted by
``keep_last``, never pruned into, never deleted and never overwritten: it is moved aside to
``step_<N>.unverified-<time>`` with a log line naming it and why.
"""

from __future__ import annotations

import logging
import os
import re
from pathlib import Path

import pytest
import torch
from test_checkpoint_files import FakeTrainer, save, small_job, weights
from test_checkpoint_integrity import flip_byte, truncate

from fp8rl.protocol import QuantConfig
from fp8rl.services import checkpoint, checkpoint_verify
from fp8rl.services.checkpoint import (
    LATEST,
    STATE_FILE,
    CheckpointCorruptError,
    CheckpointError,
    checkpoint_steps,
    find_checkpoint,
    prune_checkpoints,
    read_model_weights,
    select_checkpoint,
    verify_checkpoint,
)
from fp8rl.services.checkpointer import Checkpointer


class Sampler:
    def state_dict(self) -> dict:
        return {"cursor": 0}

    def load_state_dict(self, cursor: dict) -> None:
        self.cursor = cursor


def _checkpointer(run: Path, **spec) -> Checkpointer:
    checkpointer = Checkpointer(run, small_job(**spec))
    checkpointer._model = ({"hidden_size": 8}, None)  # no model source needed
    return checkpointer


def _names(root: Path) -> list[str]:
    """Directory entries, with the time stamp of moved-aside checkpoints cut off."""
    return sorted(re.sub(r"\.unverified-.*", ".unverified", p.name) for p in root.iterdir())


def _aside(root: Path, step: int) -> Path:
    [path] = root.glob(f"step_{step}.unverified-*")
    return path


def _resume_and_run_to(checkpointer: Checkpointer, steps: int) -> None:
    """What the driver does around the loop: resolve, restore, maybe_save each step, finish."""
    path = checkpointer.resolve()
    trainer = FakeTrainer()
    start = checkpointer.restore(path, [trainer], Sampler()) if path else 0
    for done in range(start + 1, steps + 1):
        checkpointer.maybe_save(done, [trainer], Sampler())
    checkpointer.finish(steps, [trainer], Sampler(), stopped=False)


def test_resume_past_a_corrupt_checkpoint_keeps_the_verified_one_and_moves_the_corrupt_aside(
    tmp_path, caplog
):
    """The finding: step_8 good, step_9 bytes flipped; `steps=10 resume=auto keep_last=2` (saves
    only at the end: every_n_steps=0, so step_9 is never saved again) ended with step_9, step_10."""
    root = tmp_path / "checkpoints"
    save(root, 8)
    bad = save(root, 9)
    flip_byte(bad)
    corrupt_bytes = (bad / STATE_FILE).read_bytes()

    with caplog.at_level(logging.INFO, logger="fp8rl.services.checkpoint"):
        _resume_and_run_to(_checkpointer(tmp_path, keep_last=2), 10)

    assert _names(root) == [LATEST, "step_10", "step_8", "step_9.unverified"]
    assert checkpoint_steps(root) == [8, 10]
    aside = _aside(root, 9)
    assert (aside / STATE_FILE).read_bytes() == corrupt_bytes  # untouched: the user's copy
    with pytest.raises(CheckpointCorruptError, match=f"{STATE_FILE} fails its checksum"):
        verify_checkpoint(aside)
    moved = [r.getMessage() for r in caplog.records if "moved" in r.getMessage()]
    assert len(moved) == 1 and str(bad) in moved[0] and aside.name in moved[0]
    assert f"{STATE_FILE} fails its checksum" in moved[0]
    assert (root / LATEST).read_text().strip() == "step_10"
    assert select_checkpoint(root)[0] == root / "step_10"


def test_a_later_run_never_resumes_from_counts_or_prunes_a_moved_aside_checkpoint(tmp_path):
    root = tmp_path / "checkpoints"
    save(root, 1)
    flip_byte(save(root, 2))
    _resume_and_run_to(_checkpointer(tmp_path, keep_last=1), 3)
    _resume_and_run_to(_checkpointer(tmp_path, keep_last=1), 4)
    assert _names(root) == [LATEST, "step_2.unverified", "step_4"]
    assert find_checkpoint(tmp_path) == root / "step_4"
    with pytest.raises(CheckpointError, match=r"no checkpoint for step 2 .*\[4\]"):
        find_checkpoint(tmp_path, step=2)


def test_a_resave_of_a_corrupt_step_writes_a_new_directory_and_keeps_the_corrupt_one_aside(
    tmp_path,
):
    """every_n_steps=1: the resumed run saves step_9 again; the corrupt one is not overwritten."""
    root = tmp_path / "checkpoints"
    save(root, 8)
    flip_byte(save(root, 9))
    _resume_and_run_to(_checkpointer(tmp_path, keep_last=2, every_n_steps=1), 10)
    assert _names(root) == [LATEST, "step_10", "step_9", "step_9.unverified"]
    verify_checkpoint(root / "step_9")
    with pytest.raises(CheckpointCorruptError):
        verify_checkpoint(_aside(root, 9))


def test_pruning_never_counts_a_same_size_corrupt_checkpoint_towards_keep_last(tmp_path):
    """Sizes alone pass a flipped byte: pruning must verify the checksums of what it counts."""
    root = tmp_path / "checkpoints"
    for step in (1, 2, 3, 4):
        save(root, step)
    flip_byte(root / "step_4")
    pruned = prune_checkpoints(root, keep_last=2, anchor=None)
    assert pruned.deleted == [root / "step_1"]
    assert pruned.kept == [root / "step_3", root / "step_2"]
    assert pruned.anchor == root / "step_3"
    assert [p.name.partition(".")[0] for p in pruned.set_aside] == ["step_4"]
    assert _names(root) == [LATEST, "step_2", "step_3", "step_4.unverified"]


def test_a_refused_resume_moves_nothing_aside(tmp_path):
    root = tmp_path / "checkpoints"
    save(root, 1)
    flip_byte(save(root, 2))
    before = _names(root)
    job = small_job()
    job.precision.quant = QuantConfig(scale_format="pow2")
    with pytest.raises(CheckpointError, match="another quant contract"):
        Checkpointer(tmp_path, job).resolve()
    assert _names(root) == before


def test_an_unhealthy_checkpoint_of_the_abandoned_branch_is_kept_until_the_step_is_saved_again(
    tmp_path, caplog
):
    """Verified checkpoints newer than the resume point (here healthy: false) stay where they are,
    are named in the log, and a save of the same step replaces them."""
    root = tmp_path / "checkpoints"
    save(root, 1)
    sick = save(root, 2, healthy=False, trainer=FakeTrainer(seed=7))
    checkpointer = _checkpointer(tmp_path, keep_last=3, every_n_steps=1)
    with caplog.at_level(logging.WARNING, logger="fp8rl.services.checkpoint"):
        assert checkpointer.resolve() == root / "step_1"
    assert any(
        str(sick) in r.getMessage() and "abandoned" in r.getMessage() for r in caplog.records
    )
    assert _names(root) == [LATEST, "step_1", "step_2"]
    checkpointer.restore(root / "step_1", [FakeTrainer()], Sampler())
    checkpointer.maybe_save(2, [FakeTrainer(seed=0)], Sampler())
    assert _names(root) == [LATEST, "step_1", "step_2"]
    assert verify_checkpoint(root / "step_2").healthy
    restored = read_model_weights(root / "step_2")
    assert all(torch.equal(restored[k], v) for k, v in weights(seed=0).items())


def test_rewinding_to_a_named_checkpoint_verifies_the_newer_ones_and_moves_corrupt_ones_aside(
    tmp_path,
):
    root = tmp_path / "checkpoints"
    for step in (1, 2, 3, 4):
        save(root, step)
    truncate(root / "step_4")
    checkpointer = _checkpointer(tmp_path, resume=str(root / "step_2"), keep_last=2)
    assert checkpointer.resolve() == root / "step_2"
    assert _names(root) == [LATEST, "step_1", "step_2", "step_3", "step_4.unverified"]
    assert checkpointer.anchor == root / "step_2"
    assert (root / LATEST).read_text().strip() == "step_2"  # it named the moved step_4


def test_pruning_reuses_verification_results_instead_of_hashing_every_save(tmp_path, monkeypatch):
    """Each checkpoint is hashed once per run: at resume, when written, or when pruning first
    needs it; later saves prune on those results (plus a size check)."""
    root = tmp_path / "checkpoints"
    for step in (1, 2, 3):
        save(root, step)
    hashed: list[Path] = []
    real = checkpoint_verify.hash_file
    monkeypatch.setattr(checkpoint_verify, "hash_file", lambda p: hashed.append(p) or real(p))
    per_checkpoint = 3  # .metadata, the shard, state.pt

    checkpointer = _checkpointer(tmp_path, keep_last=3, every_n_steps=1)
    path = checkpointer.resolve()
    loader = type("Rank", (), {"load": lambda self, directory: 0})()  # the ranks do not hash
    checkpointer.restore(path, [loader], Sampler())
    assert len(hashed) == per_checkpoint  # step_3 only
    for step in (4, 5, 6):
        checkpointer.save(step, [FakeTrainer()], Sampler())
    # each save hashes its own files; the first prune also verifies step_2 (still in keep_last)
    assert len(hashed) == per_checkpoint * (1 + 3 + 1)
    assert checkpoint_steps(root) == [4, 5, 6]


def test_a_resave_interrupted_between_its_two_renames_keeps_the_previous_checkpoint(tmp_path):
    """kill -9 after ``step_1`` was moved to ``.old-step_1-<pid>`` but before the new one took
    its place: the next start puts the previous checkpoint back instead of deleting it."""
    root = tmp_path / "checkpoints"
    save(root, 1, trainer=FakeTrainer(seed=1))
    (root / "step_1").rename(root / ".old-step_1-4242")
    (root / ".tmp-step_1-4242").mkdir()  # the new save, complete or not: discarded
    Checkpointer(tmp_path, small_job())
    assert _names(root) == [LATEST, "step_1"]
    verify_checkpoint(root / "step_1")
    restored = read_model_weights(root / "step_1")
    assert all(torch.equal(restored[k], v) for k, v in weights(seed=1).items())


def test_a_resave_that_fails_to_take_the_steps_place_puts_the_previous_one_back(
    tmp_path, monkeypatch
):
    root = tmp_path / "checkpoints"
    save(root, 1, trainer=FakeTrainer(seed=1))
    real = os.replace

    def fail_into_place(src, dst):
        if Path(src).name.startswith(".tmp-") and Path(dst).name == "step_1":
            raise OSError(28, "No space left on device")
        return real(src, dst)

    monkeypatch.setattr(checkpoint.os, "replace", fail_into_place)
    with pytest.raises(OSError, match="No space left"):
        save(root, 1, trainer=FakeTrainer(seed=2))
    restored = read_model_weights(root / "step_1")
    assert all(torch.equal(restored[k], v) for k, v in weights(seed=1).items())
    assert not list(root.glob(".old-*"))
