"""MATH-style scoring through math-verify in child processes: the table, timeouts, threads, Ray."""

from __future__ import annotations

import json
import threading
import time

import pytest
from fp8rl_testing import shared_path

from fp8rl.protocol.reward_messages import RewardInput
from fp8rl.protocol.reward_spec import RewardSpec
from fp8rl.workers.reward import RewardWorker
from fp8rl.workers.reward.subprocess_pool import SubprocessPool

MATH_CASES = [
    # issue 6 table
    ("… so \\boxed{12}.\n**Final Answer**\n\\boxed{12}", "12", 1.0),
    ("Answer: \\boxed{\\frac{1}{2}}", "\\frac12", 1.0),
    ("\\boxed{28\\%}", "28", 1.0),
    ("\\boxed{28}", "28\\%", 1.0),
    # brief: tuples with \left( \right), units, thousands separators, \fbox, nested braces
    ("polar form \\boxed{(3,\\pi/2)}", "\\left( 3, \\frac{\\pi}{2} \\right)", 1.0),
    ("\\boxed{5\\text{ cm}}", "5", 1.0),
    ("\\boxed{8,000}", "8000", 1.0),
    ("\\fbox{\\frac{\\sqrt{3}}{2}}", "\\frac{\\sqrt3}{2}", 1.0),
    # last box wins; wrong answers score 0
    ("first \\boxed{13}, corrected: \\boxed{12}", "12", 1.0),
    ("first \\boxed{12}, corrected: \\boxed{13}", "12", 0.0),
    ("\\boxed{\\frac{1}{3}}", "\\frac12", 0.0),
    ("no answer at all", "12", 0.0),
]


def item(response: str, answer: str, finish_reason: str = "stop") -> RewardInput:
    return RewardInput(
        prompt_id="p", prompt="q", response=response, answer=answer, finish_reason=finish_reason,
        num_tokens=10, max_tokens=64,
    )  # fmt: skip


@pytest.fixture(scope="module")
def math_worker():
    worker = RewardWorker(RewardSpec(functions=[{"name": "math"}], verifier_processes=2))
    yield worker
    worker.close()


def test_math_answer_table_scores_each_row(math_worker):
    outputs = math_worker.score([item(r, g) for r, g, _ in MATH_CASES])
    got = {r: o.reward for (r, _, _), o in zip(MATH_CASES, outputs, strict=True)}
    assert got == {r: expected for r, _, expected in MATH_CASES}
    assert all(not o.timed_out for o in outputs)


def test_math_scoring_works_off_the_main_thread(math_worker):
    results: list[float] = []
    thread = threading.Thread(
        target=lambda: results.extend(
            o.reward for o in math_worker.score([item("\\boxed{28\\%}", "28")])
        )
    )
    thread.start()
    thread.join(timeout=60)
    assert results == [1.0]


SLOW_MODULE = """
import time

def slow_score(*, response, answer, **kwargs):
    if response == "hang":
        time.sleep(30)
    return 1.0
"""


def test_outer_timeout_kills_hung_child_scores_zero_and_pool_recovers(tmp_path):
    (tmp_path / "slowmod.py").write_text(SLOW_MODULE)
    pool = SubprocessPool("slowmod:slow_score", timeout_s=1.0, pythonpath=[str(tmp_path)])
    try:
        assert pool.map([{"response": "fine", "answer": ""}])[0].value == 1.0  # warm: child started
        start = time.monotonic()
        hung, after = pool.map(
            [{"response": "hang", "answer": ""}, {"response": "fine", "answer": ""}]
        )
        assert hung.timed_out and hung.value == 0.0
        assert after.value == 1.0 and not after.timed_out
        assert time.monotonic() - start < 20
    finally:
        pool.close()


def test_worker_counts_math_timeouts(tmp_path, monkeypatch):
    (tmp_path / "slowmod.py").write_text(SLOW_MODULE)
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    monkeypatch.setattr("fp8rl.workers.reward.worker.MATH_TARGET", "slowmod:slow_score")
    worker = RewardWorker(RewardSpec(functions=[{"name": "math"}], timeout_s=1.0))
    try:
        worker.score([item("fine", "1")])  # start the child outside the timed call
        hung, fine = worker.score([item("hang", "1"), item("fine", "1")])
        assert hung.timed_out and hung.reward == 0.0
        assert not fine.timed_out and fine.reward == 1.0
        assert worker.stats()["reward/verifier_timeouts"] == 1.0
    finally:
        worker.close()


def test_math_reward_inside_a_threaded_ray_actor():
    ray = pytest.importorskip("ray")
    ray.init(address="local", num_cpus=1, include_dashboard=False, log_to_driver=False)
    try:
        actor_cls = ray.remote(RewardWorker).options(
            max_concurrency=2
        )  # methods run off the main thread
        actor = actor_cls.remote(RewardSpec(functions=[{"name": "math"}]))
        cases = MATH_CASES[:5] + MATH_CASES[-3:]
        outputs = ray.get(actor.score.remote([item(r, g) for r, g, _ in cases]), timeout=120)
        assert [o.reward for o in outputs] == [expected for _, _, expected in cases]
        ray.get(actor.close.remote())
    finally:
        ray.shutdown()


def test_math500_reference_solutions_score_their_own_answer_only(math_worker):
    rows = [
        json.loads(line)
        for line in shared_path("data", "math500", "test.jsonl").read_text().splitlines()[:40]
    ]
    right = math_worker.score([item(row["solution"], row["answer"]) for row in rows])
    shifted = math_worker.score(
        [item(row["solution"], rows[(i + 1) % len(rows)]["answer"]) for i, row in enumerate(rows)]
    )
    assert [o.reward for o in right] == [1.0] * len(rows)
    # row 22's solution (answer 5) against row 23's gold "x=5": math-verify accepts the equation
    assert [i for i, o in enumerate(shifted) if o.reward != 0.0] == [22]
