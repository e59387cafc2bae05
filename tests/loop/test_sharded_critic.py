"""The PPO critic sharded over two FSDP2 ranks (gloo, CPU) against one unsharded critic on the
same batch, and its rank-written checkpoint read back by another rank count.

Tolerance: the critic keeps FP32 master weights and runs dense BF16 linears with the fast (not
batch-invariant) kernels. Two ranks put other rows together in a micro-batch, with other padded
widths, so GEMM shapes differ: values move by kernel rounding (measured 9.6e-5 on values of
~0.1, allowed 5e-4), and each micro-batch's weight gradient is rounded to BF16 before the
micro-batches (then the ranks) are summed, so the grad norm moves by BF16 rounding (measured
2.5e-4 relative, allowed 1e-3). The first update's loss is exact to 1e-6: the zero-initialised
head makes every value 0 on both sides. The same rank count reads its own checkpoint back
bitwise.
"""

from __future__ import annotations

import pytest
import ray
import torch
from tiny import tiny_job

from fp8rl.workers.critic.worker import CriticWorker, critic_shards
from fp8rl.workers.model.scoring import pack
from fp8rl.workers.ports import free_port
from fp8rl.workers.trainer.batch import TrainBatch

pytestmark = pytest.mark.slow  # ~1 min on 2 shared cores: 3-5 critic processes

JOB = tiny_job(
    "model.path=random:tiny-qwen3",  # hidden 192: shards are not 128-aligned
    "algorithm.advantage_estimator=gae",
    "algorithm.critic_lr=1e-3",
    "trainer.micro_batch_size=2",
)


@pytest.fixture(scope="module", autouse=True)
def local_ray():
    ray.init(address="local", num_cpus=2, include_dashboard=False)
    yield
    ray.shutdown()


def _critics(n: int, *, sharded: bool = True) -> list:
    actor = ray.remote(CriticWorker).options(num_cpus=0)
    args = (JOB.model, JOB.trainer, JOB.algorithm)
    if not sharded:
        return [actor.remote(*args, device="cpu", seed=0)]
    ranks = [actor.remote(*args, device="cpu", seed=0, rank=r, world_size=n) for r in range(n)]
    init = f"tcp://127.0.0.1:{free_port()}"
    ray.get([r.join.remote(init) for r in ranks])
    return ranks


def _batch() -> tuple[TrainBatch, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    lengths = [(5, 7), (9, 3), (4, 8), (12, 6), (3, 2), (7, 9), (6, 5)]  # 7 rows: uneven ranks
    prompts = [torch.randint(5, 500, (p,), generator=gen).tolist() for p, _ in lengths]
    responses = [torch.randint(5, 500, (r,), generator=gen).tolist() for _, r in lengths]
    packed = pack(prompts, responses)
    zeros = torch.zeros(packed.response_ids.shape)
    returns = torch.randn(packed.response_ids.shape, generator=gen) * packed.response_mask
    return TrainBatch(packed, zeros, zeros, zeros, None, 0, 1.0), returns


def _values(critics: list, batch: TrainBatch) -> torch.Tensor:
    shards = critic_shards(batch, ranks=len(critics), micro_batch_size=2)
    parts = ray.get([c.values.remote(s) for c, s in zip(critics, shards, strict=True)])
    out = torch.zeros(batch.packed.response_ids.shape)
    for shard, values in zip(shards, parts, strict=True):
        out[shard.index, : values.shape[1]] = values
    return out


def _train(critics: list, batch: TrainBatch, returns, values) -> dict[str, float]:
    shards = critic_shards(batch, ranks=len(critics), micro_batch_size=2)
    calls = [
        c.train.remote(s, returns[s.index], values[s.index])
        for c, s in zip(critics, shards, strict=True)
    ]
    return ray.get(calls)[0]


def test_two_critic_ranks_match_one_and_their_checkpoint_reloads_into_one(tmp_path):
    batch, returns = _batch()
    one, two = _critics(1, sharded=False), _critics(2)
    v1, v2 = _values(one, batch), _values(two, batch)
    assert not v1.any() and not v2.any()  # the value head starts at zero
    m1, m2 = _train(one, batch, returns, v1), _train(two, batch, returns, v2)
    assert m1["critic/vf_loss"] > 0
    assert m2["critic/vf_loss"] == pytest.approx(m1["critic/vf_loss"], rel=1e-6)
    assert m2["critic/grad_norm"] == pytest.approx(m1["critic/grad_norm"], rel=1e-3)
    after = _values(two, batch)
    assert not torch.equal(after, v2)  # the update moved the values
    torch.testing.assert_close(after, _values(one, batch), rtol=0, atol=5e-4)

    files = ray.get([c.save.remote(tmp_path) for c in two])
    assert all(f.startswith("critic/") for rank in files for f in rank)
    again = _critics(2)
    ray.get([c.load.remote(tmp_path) for c in again])
    assert torch.equal(_values(again, batch), after)
    restored = _critics(1, sharded=False)
    ray.get(restored[0].load.remote(tmp_path))  # 2 ranks → 1: DCP reshards
    torch.testing.assert_close(_values(restored, batch), after, rtol=0, atol=5e-4)
    # the AdamW moments came back too: the next update is the sharded critic's
    m_two = _train(two, batch, returns, after)
    m_again = _train(again, batch, returns, after)
    assert m_again == m_two
    assert torch.equal(_values(again, batch), _values(two, batch))


def test_a_checkpoint_without_critic_shards_is_refused_by_name(tmp_path):
    critic = CriticWorker(JOB.model, JOB.trainer, JOB.algorithm, device="cpu", seed=0)
    with pytest.raises(FileNotFoundError, match="critic/"):
        critic.load(tmp_path)
