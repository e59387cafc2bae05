"""``resources.hybrid_engine``: the native engine inside the trainer's process (verl's hybrid
engine) runs the same loop as a separate engine actor, bit for bit, with weights handed over in
memory; what it cannot host is refused naming the field."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import ray
import torch
from tiny import tiny_job

from fp8rl.protocol import SpecError
from fp8rl.services.driver import run
from fp8rl.services.preflight import preflight
from fp8rl.workers.hybrid import HybridWorker
from fp8rl.workers.weight_sync.layout import weight_tensors
from fp8rl.workers.weight_sync.local import LocalTransport
from fp8rl.workers.weight_sync.update import WeightUpdateRefused

EXACT = ("precision.mode=unified_fp8", "precision.exact=true")


def _hybrid(*overrides: str) -> HybridWorker:
    job = tiny_job(*EXACT, "resources.hybrid_engine=true", *overrides)
    return HybridWorker(
        job.model, job.trainer, job.algorithm, job.precision, job.rollout,
        total_steps=2, batch_size=4, device="cpu", seed=0,
    )  # fmt: skip


def test_the_engine_takes_the_trainers_codes_in_memory_and_refuses_a_bad_update_whole():
    worker = _hybrid()
    update, handle = worker.publish()
    assert update.transport == "local" and isinstance(handle, str)
    assert worker.rollout("apply_weights", update, handle) == 0
    trained = worker.model.model.layers[0].mlp.down_proj.quantized_weight()
    served = worker.engine.model.model.layers[0].mlp.down_proj
    assert torch.equal(trained.codes.view(torch.uint8), served.weight_codes.view(torch.uint8))

    with torch.no_grad():  # a new version, then a manifest that lies about its fingerprint
        for p in worker.model.parameters():
            p.add_(0.01)
    worker._invalidate_fp8()
    worker.version += 1
    update, handle = worker.publish()
    before = served.weight_codes.clone()
    bad = update.model_copy(update={"quant_fingerprint": "0" * 16})
    with pytest.raises(WeightUpdateRefused, match="fingerprint"):
        worker.rollout("apply_weights", bad, handle)
    assert torch.equal(served.weight_codes.view(torch.uint8), before.view(torch.uint8))
    assert worker.rollout("current_version") == 0


def test_a_released_engine_refuses_to_generate_until_an_update_restores_its_weights():
    worker = _hybrid()
    worker.rollout("apply_weights", *worker.publish())
    before = worker.rollout("logits", [1, 5, 9])
    worker.rollout("release_memory")  # the driver's call while the trainer trains
    assert sum(t.untyped_storage().nbytes() for t in weight_tensors(worker.engine.model)) == 0
    with pytest.raises(RuntimeError, match="released for training"):
        worker.rollout("generate", None)
    worker.rollout("resume_memory")
    with pytest.raises(RuntimeError, match="released for training"):  # storage back, values not
        worker.rollout("generate", None)
    worker.version += 1  # the same weights as the next policy version
    assert worker.rollout("apply_weights", *worker.publish()) == 1
    assert torch.equal(worker.rollout("logits", [1, 5, 9]), before)


def test_a_local_handle_from_another_process_is_refused_with_the_reason():
    job = tiny_job(*EXACT)
    update = _hybrid().publish()[0]
    with pytest.raises(ValueError, match="hybrid_engine"):
        LocalTransport().receive(update, "local-from-elsewhere", torch.device("cpu"))
    with pytest.raises(AttributeError, match="no method '_private'"):
        _hybrid().rollout("_private")
    assert job.resources.hybrid_engine is False  # off unless asked for


@pytest.mark.parametrize(
    ("override", "field"),
    [
        ("rollout.backend=vllm", "rollout.backend"),
        ("trainer.num_workers=2", "trainer.num_workers"),
        ("rollout.num_workers=2", "rollout.num_workers"),
        ("resources.weight_transport=object_store", "resources.weight_transport"),
        ("resources.placement=disaggregated", "resources.placement"),
    ],
)
def test_preflight_names_what_a_hybrid_engine_cannot_host(override, field):
    job = tiny_job(*EXACT, "resources.hybrid_engine=true", override, "data.prompts_per_step=4")
    with pytest.raises(SpecError) as info:
        preflight(job, local=False)
    assert any(line.startswith(f"{field}: resources.hybrid_engine") for line in info.value.problems)


@pytest.mark.slow
def test_a_hybrid_run_logs_the_same_metrics_as_separate_actors_bit_for_bit(tmp_path: Path):
    ray.init(address="local", num_cpus=2, include_dashboard=False)
    try:
        rows = {}
        for hybrid in (False, True):
            job = tiny_job(
                *EXACT,
                f"resources.hybrid_engine={str(hybrid).lower()}",
                f"output_dir={tmp_path / str(hybrid)}",
                "checkpoint.save_final=false",
                "logging.backends=[jsonl]",
                "algorithm.entropy_coef=0.01",  # a gradient even when every reward is 0
            )
            run(job)
            lines = (tmp_path / str(hybrid) / job.name / "metrics.jsonl").read_text().splitlines()
            rows[hybrid] = [json.loads(line) for line in lines]
    finally:
        ray.shutdown()
    keep = ("reward/", "actor/", "mismatch/", "policy_version")
    same = [{k: v for k, v in r.items() if k.startswith(keep)} for r in rows[True]]
    assert same == [{k: v for k, v in r.items() if k.startswith(keep)} for r in rows[False]]
    assert len(same) == 2 and all(r["mismatch/abs_dlogp_max"] == 0.0 for r in same)
    assert same[0]["actor/grad_norm"] != same[1]["actor/grad_norm"]  # it trained
