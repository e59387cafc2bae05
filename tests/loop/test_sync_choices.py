"""Weight-sync decisions that need no actors: transport per placement, version agreement,
bucket layout, token-balanced trainer shards."""

from __future__ import annotations

import pytest
import torch

from fp8rl.services.runtime import auto_transport
from fp8rl.services.weights import WeightSyncError, check_versions
from fp8rl.workers.trainer.batch import plan_shards
from fp8rl.workers.weight_sync.collective import buckets


def test_cuda_ipc_only_when_every_engine_is_on_the_senders_gpu():
    gpu0, gpu1 = ("node-a", "GPU-0"), ("node-a", "GPU-1")
    assert auto_transport(gpu0, [gpu0, gpu0]) == "cuda_ipc"
    assert auto_transport(gpu0, [gpu0, gpu1]) == "nccl"
    assert auto_transport(gpu0, [("node-b", "GPU-0")]) == "nccl"
    assert auto_transport(("node-a", None), [("node-a", None)]) == "nccl"


def test_engines_at_different_versions_fail_the_sync_naming_each():
    assert check_versions([3, 3]) == 3
    with pytest.raises(WeightSyncError, match=r"rollout\[0\]=3, rollout\[1\]=2"):
        check_versions([3, 2])


def test_buckets_are_bounded_and_keep_manifest_order():
    assert buckets([4, 4, 4, 10, 1], limit=8) == [[0, 1], [2], [3], [4]]
    assert [i for b in buckets([3] * 7, limit=8) for i in b] == list(range(7))


def test_shards_balance_tokens_with_equal_micro_batch_counts():
    lengths = torch.tensor([10, 2, 9, 3, 8, 4, 1, 7])
    plan = plan_shards(lengths, ranks=3, mini_batch_size=8, micro_batch_size=2)
    rows = sorted(r for index, _, _ in plan for r in index)
    assert rows == list(range(8))
    assert {tuple(micros) for _, _, micros in plan} == {(2,)}  # 3+3+2 rows → 2 micros each
    tokens = [int(lengths[index].sum()) for index, _, _ in plan]
    assert max(tokens) - min(tokens) <= int(lengths.max())
    with pytest.raises(ValueError, match="cannot be split over 3 trainer ranks"):
        plan_shards(lengths[:2], ranks=3, mini_batch_size=8, micro_batch_size=2)
