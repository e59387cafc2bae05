"""``reward.num_workers``: 0 scores in the driver process, N splits a batch over N reward actors
and returns the outputs in the batch's order (``services/reward_pool.py``)."""

from __future__ import annotations

import pytest

from fp8rl.protocol import RewardSpec
from fp8rl.protocol.reward_messages import RewardInput
from fp8rl.services import reward_pool
from fp8rl.services.reward_pool import RewardPool

SPEC = {"functions": [{"name": "arithmetic"}]}


def _items(n: int) -> list[RewardInput]:
    """Answers 0..n-1; odd items answer correctly."""
    return [
        RewardInput(
            prompt_id=str(i),
            prompt=f"What is {i} + 0?",
            response=str(i if i % 2 else i + 1),
            answer=str(i),
            finish_reason="stop",
            num_tokens=2,
            max_tokens=8,
        )
        for i in range(n)
    ]


def test_zero_reward_workers_score_in_this_process_without_an_actor(monkeypatch):
    monkeypatch.setattr(reward_pool.ray, "remote", lambda *a: pytest.fail("an actor was started"))
    pool = RewardPool(RewardSpec(**SPEC, num_workers=0))
    assert pool.actors == []
    assert [o.reward for o in pool.score(_items(5))] == [0.0, 1.0, 0.0, 1.0, 0.0]
    pool.close()


@pytest.mark.parametrize(("n", "parts"), [(10, 3), (2, 3), (0, 2), (7, 1)])
def test_a_batch_splits_into_contiguous_shares_of_nearly_equal_size(n, parts):
    shares = reward_pool._split(list(range(n)), parts)
    assert len(shares) == parts
    assert [x for share in shares for x in share] == list(range(n))
    sizes = [len(share) for share in shares]
    assert max(sizes) - min(sizes) <= 1


def test_two_reward_actors_return_the_outputs_in_the_batchs_order():
    ray = pytest.importorskip("ray")
    ray.init(address="local", num_cpus=1, include_dashboard=False, log_to_driver=False)
    try:
        pool = RewardPool(RewardSpec(**SPEC, num_workers=2))
        assert len(pool.actors) == 2
        outputs = pool.score(_items(7))
        assert [o.reward for o in outputs] == [0.0, 1.0, 0.0, 1.0, 0.0, 1.0, 0.0]
    finally:
        ray.shutdown()


def test_a_negative_reward_worker_count_is_refused_naming_the_field():
    with pytest.raises(ValueError, match="num_workers"):
        RewardSpec(**SPEC, num_workers=-1)
