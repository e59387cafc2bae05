"""The README's quickstart command learns visibly and ends with the next-steps lines.

Runs ``fp8rl run deploy/jobs/quickstart.yaml`` as a user would (a subprocess, its own local
Ray) and checks the curve the README states: the mean reward of the last two steps is at least
0.3 above the first step's, and the closing lines name the run directory and the next commands.
Several minutes on 2 CPU cores.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from fp8rl_testing import REPO

pytestmark = pytest.mark.slow


def test_readme_quickstart_reward_rises_and_the_run_ends_with_next_steps(tmp_path):
    fp8rl = [sys.executable, "-m", "fp8rl.services.cli"]
    command = [*fp8rl, "run", str(REPO / "deploy/jobs/quickstart.yaml"), f"output_dir={tmp_path}"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=1800, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = [json.loads(x) for x in (tmp_path / "quickstart/metrics.jsonl").read_text().splitlines()]
    reward = [r["reward/mean"] for r in rows if "reward/mean" in r]
    assert [r["step"] for r in rows] == list(range(1, len(rows) + 1))
    assert (reward[-1] + reward[-2]) / 2 - reward[0] >= 0.3, reward
    err = done.stderr
    assert f"run directory: {tmp_path / 'quickstart'}" in err
    assert "fp8rl report" in err and "fp8rl export" in err and "checkpoint.resume=auto" in err
