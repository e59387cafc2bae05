"""``ray job submit`` of the GSM8K job against a local ``ray start --head`` runs the same driver."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from fp8rl_testing import shared_path

from fp8rl.services.api.ray_launcher import start_local_ray

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def ray_head(tmp_path_factory):
    # Jobs run `python` from the head's PATH: put this environment's interpreter first, as a user
    # does by activating the virtual environment before `ray start --head`.
    # Token auth off for this private head (Ray 2.60 turns it on when ~/.ray/auth_token exists).
    saved = {k: os.environ.get(k) for k in ("PATH", "RAY_AUTH_MODE")}
    os.environ["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{saved['PATH']}"
    os.environ["RAY_AUTH_MODE"] = "disabled"
    try:
        head = start_local_ray(tmp_path_factory.mktemp("ray") / "ray.log", num_cpus=2)
        yield head
        head.stop(remove_files=True)
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def test_gsm8k_job_succeeds_through_ray_job_submit(ray_head, repo: Path, tmp_path: Path):
    train = shared_path("data", "gsm8k", "train.jsonl")
    out = tmp_path / "runs"
    command = [
        sys.executable, "-m", "ray.scripts.scripts", "job", "submit",
        "--address", ray_head.dashboard_url, "--working-dir", str(repo),
        "--runtime-env", str(repo / "deploy" / "runtime_env.yaml"), "--",
        "python", "-m", "fp8rl.services.driver", "deploy/jobs/gsm8k-smollm2.yaml",
        f"data.train.path={train}", f"output_dir={out}", "steps=1", "rollout.max_tokens=8",
        "data.prompts_per_step=2", "rollout.n=2", "checkpoint.save_final=false",
    ]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=1500, cwd=repo)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "succeeded" in (done.stdout + done.stderr).lower()
    rows = [
        json.loads(line)
        for line in (out / "gsm8k-smollm2" / "metrics.jsonl").read_text().splitlines()
    ]
    assert len(rows) == 1 and rows[0]["mismatch/abs_dlogp_max"] == 0.0


def test_fp8rl_submit_validates_then_runs_the_driver_on_the_cluster(
    ray_head, repo: Path, tmp_path: Path
):
    out = tmp_path / "runs"
    base = [sys.executable, "-m", "fp8rl.services.cli", "submit"]
    bad = subprocess.run(
        [
            *base,
            "deploy/jobs/quickstart.yaml",
            "rollout.max_tokns=4",
            "--address",
            ray_head.dashboard_url,
        ],
        capture_output=True,
        text=True,
        cwd=repo,
    )
    assert bad.returncode == 2 and "did you mean max_tokens" in bad.stderr
    done = subprocess.run(
        [
            *base,
            "deploy/jobs/quickstart.yaml",
            "model.path=random:tiny-llama",
            "steps=1",
            "rollout.max_tokens=4",
            "data.prompts_per_step=2",
            "rollout.n=2",
            f"output_dir={out}",
            "checkpoint.save_final=false",
            "--address",
            ray_head.dashboard_url,
        ],
        capture_output=True,
        text=True,
        timeout=900,
        cwd=repo,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "SUCCEEDED" in done.stdout and (out / "quickstart" / "metrics.jsonl").exists()
