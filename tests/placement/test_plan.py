"""The placement plan: which GPU each actor holds, the memory estimate per GPU, the CLI view."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from fp8rl.protocol import load_job_spec
from fp8rl.services.cli import app
from fp8rl.services.memory_estimate import GIB, model_shape, param_counts, trainer_memory
from fp8rl.services.placement import actor_options, bundle_order, plan_placement
from fp8rl.services.plan_advice import advise
from fp8rl.services.runtime import planned_transport as auto_transport
from fp8rl.workers.model.config import PRESETS

HERE = Path(__file__).parent
JOBS = HERE.parents[1] / "deploy" / "jobs"
LLAMA_8GPU = JOBS / "llama3.1-8b-gsm8k-math-8gpu.yaml"
QWEN_2NODE = JOBS / "qwen2.5-7b-gsm8k-math-2node.yaml"


def test_parameter_counts_match_the_published_8b_and_7b_models():
    assert param_counts(PRESETS["llama-3.1-8b"]).total == 8_030_261_248
    assert param_counts(PRESETS["qwen2.5-7b"]).total == 7_615_616_512


def test_colocated_8_gpus_put_trainer_rank_engine_and_reference_i_on_gpu_i():
    plan = plan_placement(load_job_spec(LLAMA_8GPU))
    assert plan.fits, plan.problems
    assert plan.used_gpus == list(range(8))
    for i in range(8):
        assert plan.actors_on(i) == [("trainer", i), ("reference", i), ("rollout", i)]
        assert plan.same_gpu(("trainer", i), ("rollout", i))
        assert plan.gpu_share(i) * 3 <= 1
    assert not plan.same_gpu(("trainer", 0), ("rollout", 1))


def test_two_nodes_disaggregated_keep_roles_apart_and_engines_inside_one_node():
    plan = plan_placement(load_job_spec(QWEN_2NODE))
    assert plan.fits, plan.problems
    trainer = {g for i in range(2) for g in plan.gpus_of("trainer", i)}
    engines = [plan.gpus_of("rollout", i) for i in range(7)]
    assert trainer == {0, 1}
    assert all(len(e) == 2 and len({plan.node_of(g) for g in e}) == 1 for e in engines)
    assert not trainer & {g for e in engines for g in e}
    assert {plan.node_of(e[0]) for e in engines} == {0, 1}


def test_disaggregated_version_of_a_colocated_spec_needs_more_gpus_than_one_node():
    job = load_job_spec(LLAMA_8GPU, ["resources.placement=disaggregated"])
    plan = plan_placement(job)
    assert not plan.same_gpu(("trainer", 0), ("rollout", 0))
    assert any(p.startswith("resources: the plan needs 24 GPUs") for p in plan.problems)


def test_an_engine_whose_tensor_parallel_group_would_straddle_a_node_starts_on_the_next():
    job = load_job_spec(
        LLAMA_8GPU,
        ["rollout.tensor_parallel_size=3", "rollout.gpus_per_worker=3", "rollout.num_workers=4"],
    )
    plan = plan_placement(
        job.model_copy(update={"resources": job.resources.model_copy(update={"num_nodes": 2})})
    )
    assert [plan.gpus_of("rollout", i) for i in range(4)] == [
        (0, 1, 2),
        (3, 4, 5),
        (8, 9, 10),
        (11, 12, 13),
    ]


def test_sharding_and_offload_shrink_the_trainer_state_per_gpu():
    cfg = PRESETS["llama-3.1-8b"]
    n = param_counts(cfg).total
    one = trainer_memory(load_job_spec(LLAMA_8GPU, ["trainer.num_workers=1"]), cfg)
    eight = trainer_memory(load_job_spec(LLAMA_8GPU), cfg)
    offload = trainer_memory(load_job_spec(LLAMA_8GPU, ["trainer.offload=optimizer"]), cfg)
    assert one.parts["master_weights"] == n * 4 and eight.parts["master_weights"] == n * 4 / 8
    assert one.parts["optimizer"] == 8 * n and offload.parts["optimizer"] == 0
    assert offload.parts["gradients"] == eight.parts["gradients"]


def test_cpu_run_places_nothing_and_gets_cpu_actor_options():
    plan = plan_placement(load_job_spec(JOBS / "quickstart.yaml"))
    assert not plan.on_gpu and plan.fits
    assert actor_options(plan, "trainer", 0) == {"num_cpus": 0, "num_gpus": 0}


def test_bundle_order_groups_bundles_node_by_node():
    assert bundle_order(["n2", "n1", "n2", "n1", "n2"]) == [0, 2, 4, 1, 3]
    assert bundle_order(["a", "a", "a"]) == [0, 1, 2]


@pytest.mark.parametrize("spec", sorted(p.name for p in JOBS.glob("*.yaml")))
def test_every_deploy_spec_prints_a_plan_that_fits(spec):
    result = CliRunner().invoke(app, ["validate", "--plan", "--no-local", str(JOBS / spec)])
    assert result.exit_code == 0, result.output
    assert "the plan fits" in result.output


def test_oversubscribed_spec_exits_2_naming_the_numbers_and_what_would_fit():
    result = CliRunner().invoke(app, ["validate", "--plan", str(HERE / "oversubscribed.yaml")])
    assert result.exit_code == 2
    out = result.output
    assert "OVER" in out
    assert "resources.gpu_memory_gib: GPU 0 (node 0) needs an estimated" in out
    assert "> 141 GiB" in out and "trainer[0]" in out
    assert "trainer.offload=optimizer: peak" in out and "(fits)" in out


def test_plan_memory_of_the_oversubscribed_spec_is_over_the_declared_gpu():
    plan = plan_placement(load_job_spec(HERE / "oversubscribed.yaml"))
    assert plan.gpu_bytes(0) > 141 * GIB
    fixed = plan_placement(
        load_job_spec(HERE / "oversubscribed.yaml", ["trainer.offload=optimizer"])
    )
    assert fixed.fits and fixed.gpu_bytes(0) < 141 * GIB


def test_auto_transport_uses_cuda_ipc_only_when_every_engine_shares_the_trainer_gpu():
    one_gpu = plan_placement(load_job_spec(HERE / "oversubscribed.yaml"))
    eight = plan_placement(load_job_spec(LLAMA_8GPU))
    assert auto_transport(one_gpu, 1, on_gpu=True) == "cuda_ipc"
    assert auto_transport(eight, 8, on_gpu=True) == "nccl"  # engines 1-7 are on other GPUs
    assert auto_transport(eight, 8, on_gpu=False) == "object_store"


def test_the_api_path_never_reads_a_config_json_from_request_input(tmp_path):
    model = tmp_path / "my-model"
    model.mkdir()
    hf = {
        "model_type": "llama",
        "vocab_size": 1000,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
    }
    (model / "config.json").write_text(json.dumps(hf))
    assert model_shape(str(model)).hidden_size == 64
    assert model_shape(str(model), read_config=False) is None
    assert (
        model_shape("/data/models/Qwen2.5-7B-Instruct", read_config=False) == PRESETS["qwen2.5-7b"]
    )


def test_advice_for_one_trainer_rank_on_eight_gpus_is_to_shard_over_all_eight():
    lines = advise(load_job_spec(LLAMA_8GPU, ["trainer.num_workers=1"]))
    (shard,) = [line for line in lines if line.startswith("trainer.num_workers=8:")]
    assert shard.endswith("(fits)")
    assert advise(load_job_spec(LLAMA_8GPU)) == []  # nothing to advise for a plan that fits


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        (
            ["trainer.gpus_per_worker=2"],
            "trainer.gpus_per_worker: 2; each trainer rank holds one GPU",
        ),
        (
            ["rollout.gpus_per_worker=2"],
            "rollout.gpus_per_worker: 2; the native engine runs on one",
        ),
        (
            ["rollout.backend=vllm", "rollout.gpus_per_worker=2"],
            "rollout.gpus_per_worker: 2, but rollout.tensor_parallel_size is 1",
        ),
    ],
)
def test_actor_shapes_the_runtime_cannot_place_are_problems_naming_the_field(overrides, field):
    job = load_job_spec(JOBS / "quickstart.yaml", ["resources.device=cuda", *overrides])
    assert any(p.startswith(field) for p in plan_placement(job).problems)
