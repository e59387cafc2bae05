"""The trainer gives freed heap pages back between decoder blocks (``host_memory.
release_between_blocks``; issue 18, the quickstart's peak memory) without changing a gradient."""

from __future__ import annotations

import torch
from tiny import tiny_job

from fp8rl.workers import host_memory
from fp8rl.workers.model.scoring import pack
from fp8rl.workers.trainer.worker import TrainerWorker, _score_args


def test_the_trainer_trims_between_blocks_and_its_gradients_are_unchanged(monkeypatch):
    """One trim after each block's forward and one as each block's output gradient arrives;
    the hooks only observe: the gradients are bitwise those of the model without them."""
    job = tiny_job("precision.mode=unified_fp8", "precision.exact=true")
    trainer = TrainerWorker(
        job.model, job.trainer, job.algorithm, job.precision,
        total_steps=1, batch_size=2, device="cpu", seed=0,
    )  # fmt: skip
    g = torch.Generator().manual_seed(0)
    packed = pack(
        [torch.randint(5, 200, (7,), generator=g).tolist() for _ in range(2)],
        [torch.randint(5, 200, (3,), generator=g).tolist() for _ in range(2)],
    )

    def grads() -> list[torch.Tensor]:
        trainer.optimizer.zero_grad(set_to_none=True)
        logp, _ = trainer.model.score_responses(
            *_score_args(packed), temperature=1.0, with_entropy=False
        )
        logp.sum().backward()
        return [p.grad.clone() for p in trainer.model.parameters() if p.grad is not None]

    trims = []
    monkeypatch.setattr(host_memory, "release_free_memory", lambda: trims.append(1) or True)
    hooked = grads()
    blocks = len(trainer.model.model.layers)
    assert len(trims) == 2 * blocks, (len(trims), blocks)
    for handle in trainer._trim_hooks:
        handle.remove()
    plain = grads()
    assert len(trims) == 2 * blocks  # no hook left
    assert len(hooked) == len(plain) > 0
    assert all(torch.equal(a, b) for a, b in zip(hooked, plain, strict=True))
