"""The quickstart job runs end to end with rollout.backend=vllm (Ray actors, real driver)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from fp8rl_testing import REPO
from vllm_helpers import needs_vllm

needs_vllm()
pytestmark = [pytest.mark.vllm, pytest.mark.slow]


def test_quickstart_runs_two_steps_with_the_vllm_backend(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}  # a private local Ray
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "fp8rl.services.driver",
            str(REPO / "deploy" / "jobs" / "quickstart.yaml"),
            "rollout.backend=vllm",
            "resources.hybrid_engine=false",  # vLLM runs as an engine actor of its own
            "steps=2",
        ],
        cwd=tmp_path,  # the run directory (output_dir/name) is relative to it
        env=env,
        capture_output=True,
        text=True,
        timeout=1500,
    )
    tail = (proc.stdout + proc.stderr)[-4000:]
    assert proc.returncode == 0, tail
    assert "step 1:" in proc.stdout + proc.stderr, tail
    assert "mult_prob_err 1.0000" in proc.stdout + proc.stderr, tail  # on-policy to 1e-4
