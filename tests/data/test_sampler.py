"""PromptSampler: deterministic epochs and a checkpointable cursor."""

from __future__ import annotations

import json

import pytest

from fp8rl.services.data import PromptRecord, PromptSampler


def records(n: int) -> list[PromptRecord]:
    return [PromptRecord(prompt_id=f"p{i}", question=f"q{i}", answer=str(i)) for i in range(n)]


def ids(batch: list[PromptRecord]) -> list[str]:
    return [r.prompt_id for r in batch]


def test_each_epoch_is_a_permutation_and_batches_cross_epochs():
    sampler = PromptSampler(records(10), batch_size=4, shuffle=True, seed=0)
    drawn = [pid for _ in range(5) for pid in ids(sampler.next_batch())]  # 20 = two epochs
    assert sorted(drawn[:10]) == sorted(f"p{i}" for i in range(10))
    assert sorted(drawn[10:]) == sorted(f"p{i}" for i in range(10))
    assert drawn[:10] != drawn[10:]  # reshuffled per epoch
    assert (sampler.epoch, sampler.cursor) == (1, 10)  # the next epoch starts lazily


def test_same_seed_same_order_and_no_shuffle_keeps_file_order():
    a = PromptSampler(records(7), batch_size=3, shuffle=True, seed=5)
    b = PromptSampler(records(7), batch_size=3, shuffle=True, seed=5)
    assert [ids(a.next_batch()) for _ in range(4)] == [ids(b.next_batch()) for _ in range(4)]
    plain = PromptSampler(records(5), batch_size=2, shuffle=False, seed=5)
    assert [ids(plain.next_batch()) for _ in range(3)] == [["p0", "p1"], ["p2", "p3"], ["p4", "p0"]]


@pytest.mark.parametrize("steps_before_save", [0, 1, 2, 3, 7])
def test_restored_sampler_continues_with_exactly_the_same_batches(steps_before_save):
    original = PromptSampler(records(9), batch_size=4, shuffle=True, seed=11)
    for _ in range(steps_before_save):
        original.next_batch()
    state = json.loads(json.dumps(original.state_dict()))  # checkpoints store it as JSON
    restored = PromptSampler(records(9), batch_size=4, shuffle=True, seed=11)
    restored.load_state_dict(state)
    assert [ids(restored.next_batch()) for _ in range(6)] == [
        ids(original.next_batch()) for _ in range(6)
    ]


def test_cursor_from_another_dataset_is_refused():
    state = PromptSampler(records(9), batch_size=2, shuffle=True, seed=1).state_dict()
    with pytest.raises(ValueError, match="num_records=9"):
        PromptSampler(records(8), batch_size=2, shuffle=True, seed=1).load_state_dict(state)
    with pytest.raises(ValueError, match="seed=1"):
        PromptSampler(records(9), batch_size=2, shuffle=True, seed=2).load_state_dict(state)


def test_empty_records_or_bad_batch_size_are_user_errors():
    with pytest.raises(ValueError, match="no records"):
        PromptSampler([], batch_size=1, shuffle=False, seed=0)
    with pytest.raises(ValueError, match="batch_size"):
        PromptSampler(records(2), batch_size=0, shuffle=False, seed=0)
