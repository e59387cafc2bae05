"""The PPO critic learns: its clipped value loss falls on a fixed batch."""

from __future__ import annotations

import torch
from tiny import tiny_job

from fp8rl.workers.critic.worker import CriticWorker
from fp8rl.workers.model.scoring import pack


def test_value_loss_decreases_on_a_fixed_batch():

    job = tiny_job("algorithm.advantage_estimator=gae", "algorithm.critic_lr=1e-2")
    critic = CriticWorker(job.model, job.trainer, job.algorithm, device="cpu", seed=0)
    batch = pack([[1, 5, 9], [1, 7]], [[11, 12, 13], [14, 15]])
    returns = torch.tensor([[1.0, 1.0, 1.0], [-1.0, -1.0, 0.0]]) * batch.response_mask
    losses = []
    for _ in range(5):
        old = critic.values(batch)
        losses.append(critic.train(batch, returns, old)["critic/vf_loss"])
    assert losses[-1] < losses[0] * 0.7, losses
    assert torch.equal(critic.values(batch)[1, 2], torch.tensor(0.0))  # padding stays 0
