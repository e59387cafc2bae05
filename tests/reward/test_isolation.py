"""Reward isolation (issue 17 rows 5-6): a hung custom reward is killed after ``timeout_s`` and
scored ``failure_reward``; too many failures fail the run naming the cause; user patterns run on
RE2 (linear time) and patterns RE2 cannot bound are refused naming the field."""

from __future__ import annotations

import os
import time

import pytest

from fp8rl.protocol import SpecError, parse_job_spec
from fp8rl.protocol.reward_messages import RewardInput
from fp8rl.protocol.reward_spec import RewardSpec
from fp8rl.services.preflight import preflight
from fp8rl.workers.reward import RewardWorker
from fp8rl.workers.reward.worker import RewardFailure

HOSTILE = """
import os, time

def hang(*, response, **_):
    if response == "hang":
        with open(os.environ["HANG_PID_FILE"], "w") as fh:
            fh.write(str(os.getpid()))
        while True:
            time.sleep(1)
    return 1.0

def boom(**_):
    raise RuntimeError("grader crashed")
"""


def item(response: str) -> RewardInput:
    return RewardInput(
        prompt_id="p", prompt="q", response=response, answer="1", finish_reason="stop",
        num_tokens=4, max_tokens=8,
    )  # fmt: skip


@pytest.fixture
def hostile(tmp_path, monkeypatch):
    package = tmp_path / "hostile_rewards"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "fns.py").write_text(HOSTILE)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("HANG_PID_FILE", str(tmp_path / "hang.pid"))
    return tmp_path


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie awaiting its parent's wait() counts as gone
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().split()[2] != "Z"
    except OSError:
        return False


def test_hung_custom_reward_is_killed_after_timeout_and_scored_the_failure_value(hostile):
    spec = RewardSpec(
        functions=[{"name": "hostile_rewards.fns.hang"}],
        timeout_s=1.0,
        failure_reward=-1.0,
        max_failure_fraction=0.5,
    )
    worker = RewardWorker(spec)
    try:
        worker.score([item("warm-up")])  # the child's import is not part of the call's clock
        start = time.perf_counter()
        ok, hung = worker.score([item("fine"), item("hang")])
        elapsed = time.perf_counter() - start
    finally:
        worker.close()
    assert elapsed < 1.0 + 3.0
    assert (ok.reward, ok.timed_out) == (1.0, False)
    assert (hung.reward, hung.timed_out) == (-1.0, True)
    assert worker.stats()["reward/verifier_timeouts"] == 1.0
    pid = int((hostile / "hang.pid").read_text())
    assert not _alive(pid)  # the hung child was killed, not left spinning


def test_more_failures_than_the_allowed_fraction_fail_with_the_cause(hostile):
    spec = RewardSpec(functions=[{"name": "hostile_rewards.fns:boom"}], max_failure_fraction=0.25)
    worker = RewardWorker(spec)
    try:
        with pytest.raises(RewardFailure) as info:
            worker.score([item("a"), item("b")])
    finally:
        worker.close()
    message = str(info.value)
    assert "2 of 2 responses" in message and "reward.max_failure_fraction=0.25" in message
    assert "RuntimeError: grader crashed" in message


def test_catastrophic_pattern_runs_in_linear_time():
    spec = RewardSpec(functions=[{"name": "format", "kwargs": {"pattern": "(.+)+#"}}])
    worker = RewardWorker(spec)
    start = time.perf_counter()
    (out,) = worker.score([item("a" * 100_000)])
    assert time.perf_counter() - start < 0.5
    assert out.reward == 0.0
    assert worker.score([item("abc#")])[0].reward == 1.0


def test_pattern_re2_cannot_bound_is_refused_naming_the_field():
    job = parse_job_spec(
        "reward: {functions: [{name: arithmetic}, {name: format, kwargs: {pattern: '(a)\\1'}}]}"
    )
    with pytest.raises(SpecError) as info:
        preflight(job, local=False)
    (problem,) = info.value.problems
    assert problem.startswith("reward.functions.1.kwargs.pattern: ")
    assert "RE2" in problem


def test_default_format_pattern_still_matches_boxes_and_markers():
    worker = RewardWorker(RewardSpec(functions=[{"name": "format"}]))
    rewards = [o.reward for o in worker.score([item("\\boxed{3}"), item("#### 4"), item("4")])]
    assert rewards == [1.0, 1.0, 0.0]


def test_eval_reward_patterns_are_checked_too():
    job = parse_job_spec(
        "reward: {functions: [{name: arithmetic}]}\n"
        "eval: {rewards: {gsm8k_test: [{name: format, kwargs: {pattern: '(?=x)'}}]}}"
    )
    with pytest.raises(SpecError) as info:
        preflight(job, local=False)
    assert info.value.problems[0].startswith("eval.rewards.gsm8k_test.0.kwargs.pattern: ")
