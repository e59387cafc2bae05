"""RewardWorker: weighted terms, truncation rules, custom functions by dotted path."""

from __future__ import annotations

import json

import pytest
from fp8rl_testing import shared_path

from fp8rl.protocol.reward_messages import RewardInput
from fp8rl.protocol.reward_spec import RewardSpec
from fp8rl.workers.reward import RewardWorker


def item(response: str, answer: str = "8", finish_reason: str = "stop") -> RewardInput:
    return RewardInput(
        prompt_id="p", prompt="What is 3 + 5?", response=response, answer=answer,
        finish_reason=finish_reason, num_tokens=4, max_tokens=4,
    )  # fmt: skip


def test_terms_are_weighted_and_summed_in_input_order():
    spec = RewardSpec(functions=[{"name": "arithmetic"}, {"name": "format", "weight": 0.5}])
    outputs = RewardWorker(spec).score([item("\\boxed{8}"), item("8"), item("9")])
    assert [o.reward for o in outputs] == [1.5, 1.0, 0.0]
    assert outputs[0].terms == {"arithmetic": 1.0, "format": 1.0}
    assert not outputs[0].truncated and not outputs[0].timed_out


@pytest.mark.parametrize(("rule", "expected"), [("score", 1.0), ("zero", 0.0), ("penalty", -0.5)])
def test_truncated_response_follows_spec_rule(rule, expected):
    worker = RewardWorker(RewardSpec(truncated=rule, truncated_penalty=-0.5))
    cut, done = worker.score([item("8", finish_reason="length"), item("8")])
    assert cut.truncated and cut.reward == expected
    assert not done.truncated and done.reward == 1.0


CUSTOM_MODULE = """
def length_bonus(*, prompt, response, answer, scale=1.0, **kwargs):
    return scale * len(response)
"""


def test_custom_reward_by_dotted_path_gets_kwargs(tmp_path, monkeypatch):
    package = tmp_path / "myrewards"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "custom.py").write_text(CUSTOM_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    spec = RewardSpec(
        functions=[{"name": "myrewards.custom.length_bonus", "kwargs": {"scale": 0.1}}]
    )
    (output,) = RewardWorker(spec).score([item("abcd")])
    assert output.reward == pytest.approx(0.4)
    assert output.terms == {"myrewards.custom.length_bonus": pytest.approx(0.4)}


def test_unknown_reward_function_fails_at_construction():
    with pytest.raises(ValueError, match="no_such_module"):
        RewardWorker(RewardSpec(functions=[{"name": "no_such_module.fn"}]))


def test_gsm8k_rows_from_shared_data_score_their_own_gold():
    rows = [
        json.loads(line)
        for line in shared_path("data", "gsm8k", "test.jsonl").read_text().splitlines()[:20]
    ]
    worker = RewardWorker(RewardSpec(functions=[{"name": "gsm8k"}]))
    # a response that ends with the gold solution's own marker scores 1; a wrong number scores 0
    right = worker.score([item(row["answer"], answer=row["answer"]) for row in rows])
    wrong = worker.score([item("#### 123456789", answer=row["answer"]) for row in rows])
    assert all(o.reward == 1.0 for o in right)
    assert all(o.reward == 0.0 for o in wrong)


def test_reward_spec_refuses_a_function_listed_twice():
    with pytest.raises(ValueError, match="gsm8k listed twice"):
        RewardSpec(functions=[{"name": "gsm8k"}, {"name": "gsm8k", "weight": 2.0}])
