"""The quickstart driver loop end to end with rollout.backend=sglang against the FAKE engine
(Ray actors, the real driver). It shows that the driver and the backend fit together; it is no
substitute for running SGLang (docs/sglang.md)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from fp8rl_testing import REPO

pytestmark = pytest.mark.slow


def test_quickstart_runs_two_steps_with_the_sglang_backend_on_the_fake_engine(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}  # a private local Ray
    env |= {"FP8RL_SGLANG_ENGINE": "fake", "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        [
            sys.executable, "-m", "fp8rl.services.driver",
            str(REPO / "deploy" / "jobs" / "quickstart-sglang.yaml"),
            "steps=2", "rollout.max_tokens=8", "data.prompts_per_step=2", "rollout.n=2",
            "checkpoint.save_final=false", "logging.backends=[jsonl]",
        ],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=1500,
    )  # fmt: skip
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    assert "kernels=sglang-fake" in out, out[-4000:]  # labelled: the fake, not SGLang
    assert "FAKE SGLang engine" in out, out[-4000:]
    rows = [
        json.loads(line)
        for line in (tmp_path / "runs" / "quickstart-sglang" / "metrics.jsonl")
        .read_text()
        .splitlines()
    ]
    steps = [r for r in rows if "step" in r]
    assert len({r["step"] for r in steps}) == 2
