"""checkpoint.save_optimizer and checkpoint.weights_dtype: smaller checkpoints, and a resume
that still restores what was stored."""

from __future__ import annotations

import torch
from test_checkpoint_files import small_job, trainer_state

from fp8rl.services.checkpoint import STATE_FILE, Checkpointer, read_checkpoint


def _save(tmp_path, **options):
    job = small_job(**options)
    checkpointer = Checkpointer(tmp_path, job)
    checkpointer._model = ({"hidden_size": 8}, None)
    sampler = type("S", (), {"state_dict": lambda self: {"cursor": 0}})()
    asked = []

    def state_dict(self, *include_optimizer):
        asked.append(include_optimizer)
        return trainer_state()

    trainer = type("T", (), {"state_dict": state_dict})()
    path = checkpointer.save(1, trainer, sampler)
    size = sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
    assert asked == [() if job.checkpoint.save_optimizer else (False,)]  # moments stay put
    return path, size


def test_without_optimizer_and_in_bf16_the_checkpoint_is_smaller_and_reads_back(tmp_path):
    full, full_size = _save(tmp_path / "full")
    lean, lean_size = _save(tmp_path / "lean", save_optimizer=False, weights_dtype="bfloat16")
    assert lean_size < full_size
    assert (lean / STATE_FILE).stat().st_size < (full / STATE_FILE).stat().st_size
    _, state, _ = read_checkpoint(lean)
    assert state["optimizer"] == {} and state["scheduler"] and state["version"] == 3
    reference = trainer_state()["model"]
    for name, tensor in state["model"].items():
        assert tensor.dtype == torch.bfloat16
        assert torch.equal(tensor, reference[name].to(torch.bfloat16))


def test_defaults_keep_the_optimizer_and_float32_weights(tmp_path):
    path, _ = _save(tmp_path)
    _, state, _ = read_checkpoint(path)
    assert state["optimizer"]["state"]
    assert state["model"]["model.layers.0.weight"].dtype == torch.float32
