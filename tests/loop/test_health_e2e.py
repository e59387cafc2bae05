"""Health guards through the real driver and Ray actors (issue 17 rows 5, 7): a reward that
returns NaN fails the run before the update, naming the reward; a hung custom reward is killed
and, above the allowed fraction, fails the run naming the timeout."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import ray
from tiny import tiny_job

from fp8rl.services.driver import run
from fp8rl.services.health import RunUnhealthy

pytestmark = pytest.mark.slow

REWARDS = """
import time

def nan_reward(**_):
    return float("nan")

def hang(**_):
    while True:
        time.sleep(1)
"""


@pytest.fixture(scope="module")
def rewards_module(tmp_path_factory):
    root = tmp_path_factory.mktemp("rewards")
    (root / "e2e_rewards.py").write_text(REWARDS)
    sys.path.insert(0, str(root))
    ray.init(
        address="local",
        num_cpus=2,
        include_dashboard=False,
        runtime_env={"env_vars": {"PYTHONPATH": str(root)}},
    )
    yield root
    ray.shutdown()
    sys.path.remove(str(root))


def _steps_logged(tmp_path: Path, name: str) -> list[int]:
    path = tmp_path / name / "metrics.jsonl"
    if not path.exists():
        return []
    return [json.loads(line).get("step") for line in path.read_text().splitlines()]


def test_nan_reward_fails_the_run_before_the_update(rewards_module, tmp_path):
    job = tiny_job(
        "reward.functions=[{name: 'e2e_rewards:nan_reward'}]",
        f"output_dir={tmp_path}",
        "logging.backends=[jsonl]",
    )
    with pytest.raises(RunUnhealthy) as info:
        run(job)
    assert "step 1: reward is nan for 4 of 4 responses" in str(info.value)
    assert _steps_logged(tmp_path, job.name) == []  # no step was trained or logged


def test_hung_reward_is_killed_and_fails_the_run_naming_the_timeout(rewards_module, tmp_path):
    job = tiny_job(
        "reward.functions=[{name: 'e2e_rewards:hang'}]",
        "reward.timeout_s=1",
        f"output_dir={tmp_path}",
        "logging.backends=[jsonl]",
    )
    with pytest.raises(Exception, match=r"reward\.timeout_s=1") as info:
        run(job)
    assert "4 of 4 responses could not be scored" in str(info.value)
