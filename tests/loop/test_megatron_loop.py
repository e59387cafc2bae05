"""trainer.backend=megatron through the driver: GRPO steps on Ray actors (CPU, gloo, one rank)."""

from __future__ import annotations

import json

import pytest
import ray
from tiny import tiny_job

from fp8rl.protocol import SpecError
from fp8rl.services.driver import run
from fp8rl.services.preflight import preflight


@pytest.fixture(scope="module")
def local_ray():
    ray.init(address="local", num_cpus=2, include_dashboard=False)
    yield
    ray.shutdown()


@pytest.mark.slow  # ~70 s on 2 cores (Ray start, two actors, two steps)
def test_megatron_trainer_runs_grpo_with_zero_engine_mismatch_in_exact_mode(local_ray, tmp_path):
    job = tiny_job(
        "trainer.backend=megatron",
        "precision.mode=unified_fp8",
        "precision.exact=true",
        "checkpoint.save_final=false",
        "logging.backends=[jsonl]",
        f"output_dir={tmp_path}",
    )
    preflight(job, local=True)
    run(job)
    rows = [
        json.loads(line)
        for line in (tmp_path / job.name / "metrics.jsonl").read_text().splitlines()
    ]
    train = [r for r in rows if "actor/grad_norm" in r]
    assert [r["step"] for r in train] == [1, 2]  # steps are numbered from 1
    for r in train:  # the native engine scores exactly what the Megatron trainer scores
        assert r["mismatch/abs_dlogp_max"] == 0.0
        assert {"actor/pg_loss", "actor/entropy", "timing_s/train", "timing_s/sync"} <= r.keys()


@pytest.mark.slow  # ~2 min on 2 cores (Ray start, three actors that import Megatron)
def test_two_data_parallel_megatron_ranks_run_grpo_through_the_driver(local_ray, tmp_path):
    job = tiny_job(
        "trainer.backend=megatron",
        "trainer.num_workers=2",  # TP 1 × PP 1 × DP 2: two actors, one gloo group
        "precision.mode=unified_fp8",
        "precision.exact=true",
        "checkpoint.save_final=true",
        "logging.backends=[jsonl]",
        f"output_dir={tmp_path}",
    )
    preflight(job, local=True)
    run(job)
    rows = [
        json.loads(line)
        for line in (tmp_path / job.name / "metrics.jsonl").read_text().splitlines()
    ]
    train = [r for r in rows if "actor/grad_norm" in r]
    assert [r["step"] for r in train] == [1, 2]
    for r in train:  # each rank scored its replica's rows; together: the engine's exact scores
        assert r["mismatch/abs_dlogp_max"] == 0.0
    final = tmp_path / job.name / "checkpoints" / "step_2" / "trainer"
    assert {"rank_0.pt", "rank_1.pt", ".metadata"} <= {p.name for p in final.iterdir()}


def test_multi_rank_megatron_passes_preflight_and_fp8_kv_is_refused():
    job = tiny_job(
        "trainer.backend=megatron",
        "trainer.num_workers=2",
        "precision.mode=unified_fp8",
        "precision.quant.kv_cache_dtype=fp8_e4m3",
    )
    with pytest.raises(SpecError) as info:
        preflight(job, local=False)
    fields = [p.split(":")[0] for p in info.value.problems]
    assert fields == ["precision.quant.kv_cache_dtype"]


def test_preflight_names_a_tp_split_that_leaves_half_fp8_blocks():
    job = tiny_job(  # tiny-llama: 1 KV head cannot split over TP 2
        "trainer.backend=megatron",
        "trainer.tensor_parallel_size=2",
        "trainer.num_workers=2",
    )
    with pytest.raises(SpecError) as info:
        preflight(job, local=True)
    assert (
        "trainer.tensor_parallel_size: num_key_value_heads (1) is not divisible by TP 2"
        in info.value.problems
    )


def test_validate_prints_the_megatron_rank_layout(tmp_path):
    from typer.testing import CliRunner

    from fp8rl.services.cli import app

    spec = tmp_path / "job.yaml"
    spec.write_text("model: {path: 'random:tiny-llama'}\ntrainer: {backend: megatron}\n")
    result = CliRunner().invoke(app, ["validate", str(spec)])
    assert result.exit_code == 0, result.output
    assert "# megatron trainer: 1 ranks = TP 1 × PP 1 × DP 1 (stage 0: ranks 0-0)" in result.output


def test_validate_plan_shows_the_megatron_rank_layout(tmp_path):
    from typer.testing import CliRunner

    from fp8rl.services.cli import app

    spec = tmp_path / "job.yaml"
    spec.write_text(
        "model: {path: 'random:small-llama'}\n"
        "trainer: {backend: megatron, num_workers: 8, tensor_parallel_size: 2,"
        " pipeline_parallel_size: 2}\n"
    )
    result = CliRunner().invoke(app, ["validate", "--plan", str(spec)])
    assert (
        "# megatron trainer: 8 ranks = TP 2 × PP 2 × DP 2 (stage 0: ranks 0-3; stage 1: ranks 4-7)"
        in result.output
    ), result.output


def test_driver_shards_megatron_batches_per_data_parallel_replica():
    import torch

    from fp8rl.services.step_batch import trainer_shards
    from fp8rl.workers.model.scoring import pack
    from fp8rl.workers.trainer.batch import TrainBatch

    job = tiny_job(  # 8 ranks = TP 2 × PP 2 × DP 2, rank = tp + 2·(dp + 2·pp)
        "trainer.backend=megatron",
        "trainer.num_workers=8",
        "trainer.tensor_parallel_size=2",
        "trainer.pipeline_parallel_size=2",
    )
    packed = pack([[1, 2, 3]] * 4, [[4, 5], [6], [7, 8, 9], [1]])
    zeros = torch.zeros(4, 3)
    shards = trainer_shards(TrainBatch(packed, zeros, zeros, zeros, None, 0, 1.0), job)
    rows = [sorted(s.index.tolist()) for s in shards]
    assert len(shards) == 8 and rows[0] != rows[2]  # two replicas, different rows
    assert sorted(rows[0] + rows[2]) == [0, 1, 2, 3]
    for rank in range(8):  # every TP/PP rank of a replica holds that replica's rows
        dp = (rank // 2) % 2
        assert rows[rank] == rows[2 * dp]
