"""The trainer checks its quantizations once per micro-batch (``deferred_finite_checks``,
issue 14): a bad micro-batch is still refused before the optimizer step, and the deferral
changes no result."""

from __future__ import annotations

import pytest
import torch
from tiny import tiny_job

from fp8rl.workers.model.scoring import pack
from fp8rl.workers.trainer.batch import TrainBatch
from fp8rl.workers.trainer.worker import TrainerWorker


def _trainer():
    job = tiny_job("precision.mode=unified_fp8", "precision.exact=true")
    return TrainerWorker(
        job.model, job.trainer, job.algorithm, job.precision,
        total_steps=2, batch_size=2, device="cpu", seed=0,
    )  # fmt: skip


def _batch() -> TrainBatch:
    g = torch.Generator().manual_seed(0)
    packed = pack(
        [torch.randint(5, 200, (7,), generator=g).tolist() for _ in range(2)],
        [torch.randint(5, 200, (3,), generator=g).tolist() for _ in range(2)],
    )
    zeros = torch.zeros(2, 3)
    return TrainBatch(packed, zeros, zeros, torch.randn(2, 3, generator=g), None, 0, 1.0)


def test_a_micro_batch_with_an_overflow_is_refused_before_the_optimizer_step():
    """An inf in the first block's norm weight makes every activation quantization of the
    micro-batch non-finite: train() raises the quantizer's error and no weight, moment or
    version moves."""
    trainer = _trainer()
    batch = _batch()
    norm = trainer.model.model.layers[0].input_layernorm.weight
    with torch.no_grad():
        norm[3] = float("inf")
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    with pytest.raises(ValueError, match="non-finite input"):
        trainer.train(batch)
    assert trainer.version == 0
    assert not trainer.optimizer.state  # no AdamW step taken
    for name, p in trainer.model.named_parameters():
        assert torch.equal(p.detach(), before[name]), name


def test_training_with_deferred_checks_matches_training_with_immediate_ones(monkeypatch):
    """The deferral moves only the sync: the same batch gives bitwise the same weights."""
    from fp8rl.workers.trainer import worker

    deferred, immediate = _trainer(), _trainer()
    deferred.train(_batch())
    monkeypatch.setattr(worker, "deferred_finite_checks", _no_deferral)
    immediate.train(_batch())
    for (name, a), (_, b) in zip(
        deferred.model.named_parameters(), immediate.model.named_parameters(), strict=True
    ):
        assert torch.equal(a, b), name


class _no_deferral:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False
