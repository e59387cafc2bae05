"""Save → kill -9 (mid-save) → resume through the real driver on Ray, tiny random Llama on CPU.

An uninterrupted run and a run killed while saving step_2, then resumed with ``resume: auto``,
must log identical metrics for every step (timings aside) and end with bit-identical weights.
The KL term is on, so a resume that handed the *restored* weights to the reference policy
(instead of the initial ones) would change ``actor/kl`` and fail here.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import ray
import torch
import yaml

from fp8rl.protocol import load_job_spec
from fp8rl.services.checkpoint import (
    LATEST,
    META,
    TEST_DELAY_ENV,
    TRAINER_DIR,
    read_checkpoint,
    read_model_weights,
)
from fp8rl.services.driver import run

SPEC = {
    "seed": 3,
    "steps": 3,
    "model": {"path": "random:tiny-llama", "dtype": "bfloat16", "max_model_len": 128},
    "data": {
        "train": {"type": "arithmetic", "difficulty": 1},
        "prompts_per_step": 2,
        "prompt_template": "What is {question}?",
        "max_prompt_tokens": 64,
    },
    "rollout": {"backend": "native", "n": 4, "temperature": 1.0, "max_tokens": 6},
    "trainer": {"backend": "native", "lr": 1.0e-3, "micro_batch_size": 4, "mini_batch_size": 4},
    # reward variance on random text: does the response contain a capital letter
    "reward": {"functions": [{"name": "format", "kwargs": {"pattern": "[A-Z]"}}]},
    "algorithm": {"advantage_estimator": "grpo", "kl": {"coef": 0.05}},
    "precision": {"mode": "unified_fp8", "exact": True},
    "checkpoint": {"every_n_steps": 1, "keep_last": 3},
    "logging": {"backends": ["jsonl"]},
}


@pytest.fixture(scope="module")
def ray_address():
    started = not ray.is_initialized()
    if started:
        ray.init(address="local", include_dashboard=False, log_to_driver=False)
    yield ray.get_runtime_context().gcs_address
    if started:
        ray.shutdown()


def metrics_by_step(run_dir: Path) -> dict[int, dict]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r["step"] for r in rows]
    assert len(steps) == len(set(steps)), f"a step was logged twice: {steps}"
    return {
        r["step"]: {k: v for k, v in r.items() if not k.startswith(("timing_s/", "perf/"))}
        for r in rows
    }


def kill_session(proc: subprocess.Popen) -> None:
    """SIGKILL the driver's process group, then any process left in its session (its Ray
    workers), by pid."""
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if os.getsid(int(entry.name)) == proc.pid:
                    os.kill(int(entry.name), signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                continue


@pytest.mark.slow
@pytest.mark.parametrize(
    "ranks, algorithm",
    [(1, "grpo"), (2, "grpo"), (2, "gae")],  # gae: two sharded critic ranks are checkpointed too
    ids=["1-rank", "2-ranks", "2-ranks-ppo-critic"],
)
def test_run_killed_mid_save_resumes_with_the_metrics_of_an_uninterrupted_run(
    tmp_path, ray_address, ranks, algorithm
):
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump({**SPEC, "output_dir": str(tmp_path / "runs")}))

    torch.manual_seed(3)
    # ranks write their own DCP shards
    sharding = f"trainer.num_workers={ranks} algorithm.advantage_estimator={algorithm}"
    run(load_job_spec(spec, ["name=straight", *sharding.split()]))  # the uninterrupted reference
    straight = tmp_path / "runs" / "straight"

    crashy = tmp_path / "runs" / "crashy"
    command = [sys.executable, "-m", "fp8rl.services.driver", str(spec), "name=crashy"]
    command += sharding.split()
    proc = subprocess.Popen(
        [*command, f"resources.ray_address={ray_address}"],
        env={**os.environ, TEST_DELAY_ENV: "2:120"},  # the save of step_2 pauses mid-write
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        deadline, partial = time.monotonic() + 240, []
        while not partial and proc.poll() is None and time.monotonic() < deadline:
            partial = list((crashy / "checkpoints").glob(f".tmp-step_2-*/{TRAINER_DIR}/.metadata"))
            time.sleep(0.1)
        assert partial, f"the save of step_2 never started (driver exit code {proc.poll()})"
    finally:
        kill_session(proc)

    root = crashy / "checkpoints"
    assert (root / LATEST).read_text().strip() == "step_1"
    assert not (partial[0].parent.parent / META).exists() and not (root / "step_2").exists()
    meta, _ = read_checkpoint(root / "step_1")
    assert meta.step == 1 and meta.policy_version == 2  # 2 mini-batches per step

    run(load_job_spec(spec, ["name=crashy", *sharding.split()]))  # resume: auto

    expected, got = metrics_by_step(straight), metrics_by_step(crashy)
    assert sorted(got) == [1, 2, 3]  # steps are numbered from 1
    for step in (2, 3):  # the steps the resumed run recomputed
        assert got[step] == expected[step], f"step {step} differs after resume"
    assert expected[3]["actor/kl"] > 0 and expected[3]["actor/grad_norm"] > 0  # not a no-op
    if algorithm == "gae":  # a critic that restarted from scratch would log other losses
        assert expected[3]["critic/vf_loss"] > 0
        assert (root / "step_1" / "critic" / ".metadata").is_file()
    final = {
        name: read_model_weights(d / "checkpoints" / "step_3")
        for name, d in (("straight", straight), ("crashy", crashy))
    }
    assert all(torch.equal(final["straight"][k], final["crashy"][k]) for k in final["straight"])
    assert not list(root.glob(".tmp-*"))  # the half-written save was cleaned up
