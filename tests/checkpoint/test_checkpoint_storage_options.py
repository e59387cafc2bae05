"""checkpoint.save_optimizer and checkpoint.weights_dtype: smaller rank-written checkpoints, and a
load that restores what was stored (BF16 weights into the FP32 master; no optimizer: AdamW
restarts, with a warning)."""

from __future__ import annotations

import logging

import torch

from fp8rl.protocol import parse_job_spec
from fp8rl.workers.trainer.worker import TrainerWorker


def _trainer(job, seed: int = 0) -> TrainerWorker:
    return TrainerWorker(
        job.model,
        job.trainer,
        job.algorithm,
        job.precision,
        total_steps=2,
        batch_size=4,
        device="cpu",
        seed=seed,
    )


def _size(path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def _with_adam_state(trainer: TrainerWorker) -> TrainerWorker:
    for p in trainer.model.parameters():  # one AdamW step so the moments exist
        p.grad = torch.ones_like(p)
    trainer.optimizer.step()
    trainer.optimizer.zero_grad(set_to_none=True)
    return trainer


def test_without_optimizer_and_in_bf16_the_checkpoint_is_smaller_and_loads_back(tmp_path, caplog):
    job = parse_job_spec("", ["model.path=random:tiny-llama", "precision.mode=bf16"])
    trainer = _with_adam_state(_trainer(job))
    trainer.save(tmp_path / "full")
    trainer.save(tmp_path / "lean", False, "bfloat16")
    assert _size(tmp_path / "lean") < _size(tmp_path / "full") / 3
    master = {k: v.detach().clone() for k, v in trainer.model.state_dict().items()}
    fresh = _trainer(job, seed=1)
    with caplog.at_level(logging.WARNING):
        fresh.load(tmp_path / "lean")
    assert "AdamW restarts" in caplog.text
    moments = [
        v for st in fresh.optimizer.state.values() for k, v in st.items() if k.startswith("exp_avg")
    ]
    assert all(not torch.any(m) for m in moments)  # nothing stored: AdamW starts from zero
    for name, tensor in fresh.model.state_dict().items():
        assert tensor.dtype == master[name].dtype  # loaded into the master dtype
        assert torch.equal(tensor, master[name].to(torch.bfloat16).to(tensor.dtype))


def test_defaults_keep_the_optimizer_and_float32_weights(tmp_path):
    job = parse_job_spec("", ["model.path=random:tiny-llama", "precision.mode=bf16"])
    trainer = _with_adam_state(_trainer(job))
    trainer.save(tmp_path)
    fresh = _trainer(job, seed=1)
    fresh.load(tmp_path)
    saved = {k: v["exp_avg"] for k, v in trainer.optimizer.state.items()}
    restored = [v["exp_avg"] for v in fresh.optimizer.state.values()]
    assert len(restored) == len(saved) and all(torch.any(m) for m in restored)
    for name, tensor in fresh.model.state_dict().items():
        assert torch.equal(tensor, trainer.model.state_dict()[name])
