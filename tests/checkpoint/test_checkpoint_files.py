"""Checkpoint files: atomic layout, exact round trip, latest pointer, pruning, the quant contract.

The trainer ranks' own state (AdamW, scheduler, RNG; any rank count) is tested with real ranks in
``tests/loop/test_sharded_trainer.py``; here a one-rank weights-only writer stands in for them.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch

from fp8rl.protocol import JobSpec, QuantConfig
from fp8rl.services.checkpoint import (
    LATEST,
    META,
    TEST_DELAY_ENV,
    TRAINER_DIR,
    CheckpointCorruptError,
    CheckpointError,
    find_checkpoint,
    latest_checkpoint,
    read_checkpoint,
    read_model_weights,
    verify_checkpoint,
    write_checkpoint,
    write_model_shards,
)
from fp8rl.services.checkpointer import Checkpointer

SHARD = f"{TRAINER_DIR}/__0_0.distcp"
"""The one rank's DCP data file."""


def small_job(**checkpoint) -> JobSpec:
    return JobSpec(
        name="ckpt-unit",
        model={"path": "random:tiny-llama", "max_model_len": 128},
        data={"max_prompt_tokens": 64},
        rollout={"max_tokens": 8},
        checkpoint=checkpoint,
    )


def weights(seed: int = 0) -> dict:
    """Master weights of a little model (HF-style names, float32 and bfloat16)."""
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Linear(16, 4, bias=False))
    model[1].to(torch.bfloat16)
    return {f"model.layers.{k}": v.detach().clone() for k, v in model.state_dict().items()}


class FakeTrainer:
    """One trainer rank that saves only weights (the driver-side protocol of TrainerWorker)."""

    def __init__(self, seed: int = 0, version: int = 3) -> None:
        self.weights, self.version, self.loaded = weights(seed), version, None

    def save(self, directory: Path, optimizer: bool = True, weights_dtype: str = "") -> list[str]:
        return write_model_shards(directory, self.weights)

    def load(self, directory: Path) -> int:
        self.loaded = read_model_weights(directory)
        return self.version

    def current_version(self) -> int:
        return self.version


def save(root: Path, step: int, job: JobSpec | None = None, **kw) -> Path:
    trainer = kw.pop("trainer", None) or FakeTrainer(version=step * 2)
    return write_checkpoint(
        root,
        step=step,
        job=job or small_job(),
        write_trainer=trainer.save,
        policy_version=trainer.version,
        data_cursor={"epoch": 0, "cursor": step * 4, "seed": 0, "shuffle": True, "num_records": 9},
        model_config={"hidden_size": 8},
        tokenizer_dir=kw.pop("tokenizer_dir", None),
        **kw,
    )


def test_round_trip_restores_every_tensor_and_counter_bit_for_bit(tmp_path):
    trainer = FakeTrainer(version=3)
    tok = tmp_path / "tok"
    tok.mkdir()
    (tok / "tokenizer.json").write_text("{}")
    (tok / "chat_template.jinja").write_text("{{ messages }}")
    (tok / "model.safetensors").write_text("not copied")
    path = save(tmp_path / "checkpoints", 2, trainer=trainer, tokenizer_dir=tok)
    meta, _ = read_checkpoint(path)
    assert (meta.step, meta.policy_version, meta.data_cursor["cursor"]) == (2, 3, 8)
    restored = read_model_weights(path)
    for name, tensor in trainer.weights.items():
        assert restored[name].dtype == tensor.dtype
        assert torch.equal(restored[name], tensor)
    assert sorted(p.name for p in (path / "tokenizer").iterdir()) == [
        "chat_template.jinja",
        "tokenizer.json",
    ]


def test_a_checkpoint_of_the_older_unsharded_format_is_refused_with_the_reason(tmp_path):
    path = save(tmp_path / "checkpoints", 1)
    meta = json.loads((path / META).read_text())
    (path / META).write_text(json.dumps({**meta, "format_version": 1}))
    with pytest.raises(CheckpointCorruptError, match=r"format_version 1, this fp8rl reads 2"):
        verify_checkpoint(path)


def test_latest_points_at_the_newest_and_keep_last_prunes_older(tmp_path):
    job = small_job(keep_last=2)
    checkpointer = Checkpointer(tmp_path, job)
    checkpointer._model = ({"hidden_size": 8}, None)
    sampler = type("S", (), {"state_dict": lambda self: {"cursor": 0}})()
    for step in (1, 2, 3):
        checkpointer.save(step, [FakeTrainer()], sampler)
    root = tmp_path / "checkpoints"
    assert (root / LATEST).read_text().strip() == "step_3"
    assert sorted(p.name for p in root.iterdir()) == [LATEST, "step_2", "step_3"]
    assert latest_checkpoint(root) == root / "step_3"


def test_saving_a_step_again_replaces_it_and_keeps_one_directory(tmp_path):
    root = tmp_path / "checkpoints"
    save(root, 1, trainer=FakeTrainer(seed=1))
    save(root, 1, trainer=FakeTrainer(seed=2))
    restored = read_model_weights(root / "step_1")
    assert all(torch.equal(restored[k], v) for k, v in weights(seed=2).items())
    assert sorted(p.name for p in root.iterdir()) == [LATEST, "step_1"]


def test_checkpoint_of_another_quant_config_is_refused_naming_both_fingerprints(tmp_path):
    old = small_job()
    save(tmp_path / "checkpoints", 1, job=old)
    new = small_job()
    new.precision.quant = QuantConfig(scale_format="pow2")
    with pytest.raises(CheckpointError) as error:
        Checkpointer(tmp_path, new).resolve()
    message = str(error.value)
    assert old.precision.quant.fingerprint() in message
    assert new.precision.quant.fingerprint() in message
    assert "scale_format" in message and "allow_quant_change" in message
    allowed = small_job(allow_quant_change=True)
    allowed.precision.quant = QuantConfig(scale_format="pow2")
    assert Checkpointer(tmp_path, allowed).resolve() == tmp_path / "checkpoints" / "step_1"


def test_checkpoint_of_another_precision_mode_is_refused(tmp_path):
    save(tmp_path / "checkpoints", 1, job=small_job())
    job = small_job()
    job.precision.mode = "bf16"
    with pytest.raises(CheckpointError, match=r"precision\.mode unified_fp8"):
        Checkpointer(tmp_path, job).resolve()


def test_resume_never_auto_and_path(tmp_path):
    run = tmp_path / "run"
    assert Checkpointer(run, small_job()).resolve() is None  # auto, nothing saved yet
    save(run / "checkpoints", 1)
    save(run / "checkpoints", 2)
    assert Checkpointer(run, small_job(resume="never")).resolve() is None
    assert Checkpointer(run, small_job()).resolve() == run / "checkpoints" / "step_2"
    other = tmp_path / "other"
    for target in (run, run / "checkpoints" / "step_1"):
        got = Checkpointer(other, small_job(resume=str(target))).resolve()
        assert got == (run / "checkpoints" / ("step_2" if target == run else "step_1"))
    with pytest.raises(CheckpointError, match=r"no checkpoint for step 7 .*\[1, 2\]"):
        find_checkpoint(run, step=7)
    with pytest.raises(CheckpointError, match="no complete checkpoint"):
        Checkpointer(other, small_job(resume=str(tmp_path / "missing"))).resolve()


_SAVER = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    sys.path.insert(0, {tests!r})
    from test_checkpoint_files import save
    root = Path(sys.argv[1])
    save(root, 1)
    print("saved 1", flush=True)
    save(root, 2)   # paused mid-write by the test hook, then killed
    print("saved 2", flush=True)
    """
)


def test_kill_9_during_a_save_leaves_latest_on_the_previous_complete_checkpoint(tmp_path):
    root = tmp_path / "checkpoints"
    script = tmp_path / "saver.py"
    script.write_text(_SAVER.format(tests=str(Path(__file__).parent)))
    env = {**os.environ, TEST_DELAY_ENV: "2:60"}
    proc = subprocess.Popen(
        [sys.executable, str(script), str(root)],
        env=env,
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 60
        partial = []
        while time.monotonic() < deadline and not partial:
            partial = [p for p in root.glob(".tmp-step_2-*") if (p / SHARD).exists()]
            time.sleep(0.05)
        assert partial, "the save of step 2 never started"
        time.sleep(0.2)  # inside the paused save: weights written, meta not yet
        os.killpg(proc.pid, signal.SIGKILL)
    finally:
        proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL
    assert "saved 2" not in proc.stdout.read()
    assert (root / LATEST).read_text().strip() == "step_1"
    assert not (root / "step_2").exists() and not (partial[0] / META).exists()
    meta, _ = read_checkpoint(latest_checkpoint(root))  # complete and loadable
    assert meta.step == 1 and meta.policy_version == 2
    assert read_model_weights(root / "step_1").keys() == weights().keys()
    Checkpointer(tmp_path, small_job())  # the next start removes the half-written save
    assert sorted(p.name for p in root.iterdir()) == [LATEST, "step_1"]


def test_meta_records_spec_fingerprint_and_file_records(tmp_path):
    job = small_job()
    path = save(tmp_path / "checkpoints", 4, job=job)
    meta = json.loads((path / META).read_text())
    assert meta["quant_fingerprint"] == job.precision.quant.fingerprint()
    assert JobSpec.model_validate(meta["job"]) == job
    assert meta["files"][SHARD]["size"] == (path / SHARD).stat().st_size
    assert meta["healthy"] is True
