"""The main job end to end on the real model: the quickstart (SmolLM2-135M + arithmetic, unified
FP8, exact) through Ray actors, with each algorithm family, evaluation on GSM8K/MATH-500 slices."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import ray
from fp8rl_testing import REPO, shared_path

from fp8rl.protocol import load_job_spec
from fp8rl.services.driver import run

pytestmark = pytest.mark.slow

FAST = [
    "steps=2",
    "rollout.max_tokens=8",
    "data.prompts_per_step=2",
    "rollout.n=2",
    "checkpoint.save_final=false",
    "logging.backends=[jsonl]",
]


@pytest.fixture(scope="module", autouse=True)
def local_ray():
    ray.init(address="local", num_cpus=2, include_dashboard=False)
    yield
    ray.shutdown()


def _run(tmp_path: Path, *overrides: str) -> list[dict]:
    job = load_job_spec(
        REPO / "deploy" / "jobs" / "quickstart.yaml", [*FAST, f"output_dir={tmp_path}", *overrides]
    )
    run(job)
    return [
        json.loads(line)
        for line in (tmp_path / job.name / "metrics.jsonl").read_text().splitlines()
    ]


def test_quickstart_grpo_runs_with_bitwise_parity_and_evaluation(tmp_path):
    gsm8k = shared_path("data", "gsm8k", "test.jsonl")
    math500 = shared_path("data", "math500", "test.jsonl")
    evals = (
        f"eval.datasets=[{{type: file, path: {gsm8k}}}, "
        f"{{type: file, path: {math500}, prompt_key: problem, answer_key: answer}}]"
    )
    rows = _run(
        tmp_path,
        evals,
        "eval.limit=2",
        "eval.every_n_steps=2",
        "eval.max_tokens=16",
        "eval.rewards={gsm8k_test: [{name: gsm8k}], math500_test: [{name: math}]}",
    )
    train = [r for r in rows if "reward/mean" in r]
    assert [r["step"] for r in train] == [1, 2]  # steps are numbered from 1, as in the API
    for r in train:
        assert r["mismatch/abs_dlogp_max"] == 0.0 and r["mismatch/token_mult_prob_error"] == 1.0
        assert {
            "timing_s/rollout",
            "timing_s/train",
            "timing_s/sync",
            "actor/grad_norm",
        } <= r.keys()
    val = {k: v for r in rows for k, v in r.items() if k.startswith("val/")}
    assert 0.0 <= val["val/gsm8k_test/acc"] <= 1.0 and 0.0 <= val["val/math500_test/acc"] <= 1.0


@pytest.mark.parametrize(
    "algorithm",
    [
        [
            "algorithm.dynamic_sampling=true",
            "algorithm.clip_ratio_high=0.28",
            "algorithm.overlong_buffer=4",
        ],
        ["algorithm.advantage_estimator=gae"],
        ["algorithm.policy_loss=gspo", "algorithm.loss_agg=seq_mean_token_mean"],
    ],
    ids=["dapo", "ppo_gae", "gspo"],
)
def test_quickstart_runs_each_algorithm(tmp_path, algorithm):
    rows = _run(tmp_path, *algorithm)
    assert len(rows) == 2 and all(r["mismatch/abs_dlogp_max"] == 0.0 for r in rows)
    if "algorithm.advantage_estimator=gae" in algorithm:
        assert all("critic/vf_loss" in r for r in rows)


def test_quickstart_with_two_fsdp_trainer_ranks_matches_one_rank(tmp_path):
    """trainer.num_workers=2 (FSDP2 over gloo): engines and trainer stay bitwise equal at every
    step while the policy learns, and the first step, where both runs hold the same policy and
    sample the same tokens, has the one-rank grad norm within 5e-3 relative.

    Why 5e-3: quickstart trains in unified_fp8, whose WGrad quantizes gradients in groups of 128
    tokens of a micro-batch; two ranks put other rows together in a micro-batch, which moves each
    gradient by FP8 rounding (measured 5.4e-4 here). With an FP32 trainer the same comparison
    holds to 1e-4 over two updates on a fixed batch (tests/loop/test_sharded_trainer.py).

    Why only the first step: AdamW's first update is lr * sign(g) per weight, so a rounding-level
    difference in a near-zero gradient moves that weight the other way; the next rollout then
    samples other tokens (measured: step 2 reward 0.125 with one rank, 0.0 with two), and later
    steps compare different batches, not the sharding.
    """
    same = ("steps=3", "data.prompts_per_step=4")  # 8 samples: a step with gradient
    one = _run(tmp_path / "one", *same, "steps=1")
    two = _run(tmp_path / "two", *same, "trainer.num_workers=2", "resources.hybrid_engine=false")
    assert len(two) == 3 and all(r["mismatch/abs_dlogp_max"] == 0.0 for r in two)
    assert one[0]["actor/grad_norm"] > 0  # the compared step actually learned
    assert two[0]["reward/mean"] == one[0]["reward/mean"]  # the same samples
    assert two[0]["actor/grad_norm"] == pytest.approx(one[0]["actor/grad_norm"], rel=5e-3)
