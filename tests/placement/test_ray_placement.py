"""The placement group on a Ray with two logical GPUs: actors sharing a plan GPU get the same
device, fractional shares, and the group is released at the end."""

from __future__ import annotations

import os
import time

import pytest
import ray

from fp8rl.protocol import parse_job_spec
from fp8rl.services.placement import RayPlacement, actor_options, plan_placement


@ray.remote
class _Probe:
    def gpu_ids(self) -> list[str]:
        return [str(g) for g in ray.get_gpu_ids()]

    def visible(self) -> str:
        return os.environ.get("CUDA_VISIBLE_DEVICES", "")


@pytest.fixture(scope="module")
def two_gpu_ray():
    ray.init(address="local", num_cpus=2, num_gpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


@pytest.mark.slow
def test_actors_land_on_their_plan_gpus_with_fractional_shares(two_gpu_ray):
    job = parse_job_spec(
        "",
        [
            "resources.device=cuda",
            "resources.gpus_per_node=2",
            "resources.cpus_per_worker=0.5",
            "trainer.gpus_per_worker=1",
            "rollout.gpus_per_worker=1",
            "rollout.num_workers=2",
        ],
    )
    plan = plan_placement(job)
    placement = RayPlacement(plan, timeout_s=60)
    try:
        opts = {a: actor_options(plan, *a, placement) for a in plan.assignments}
        assert opts[("trainer", 0)]["num_gpus"] == 0.5 and opts[("rollout", 1)]["num_gpus"] == 1.0
        probes = {a: _Probe.options(**o).remote() for a, o in opts.items()}
        ids = {a: ray.get(p.gpu_ids.remote()) for a, p in probes.items()}
        assert ids[("trainer", 0)] == ids[("rollout", 0)]
        assert len(ids[("rollout", 1)]) == 1 and ids[("rollout", 1)] != ids[("rollout", 0)]
        for p in probes.values():
            ray.kill(p)
    finally:
        placement.remove()
    deadline = time.monotonic() + 30  # removal is asynchronous
    while ray.available_resources().get("GPU", 0) < 2 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert ray.available_resources().get("GPU", 0) == pytest.approx(2.0)


@pytest.mark.slow
def test_a_tensor_parallel_engine_sees_exactly_the_devices_of_its_bundles(two_gpu_ray):
    job = parse_job_spec(
        "",
        [
            "resources.device=cuda",
            "resources.gpus_per_node=2",
            "resources.cpus_per_worker=0.5",
            "trainer.gpus_per_worker=1",
            "rollout.backend=vllm",
            "rollout.tensor_parallel_size=2",
            "rollout.gpus_per_worker=2",
        ],
    )
    plan = plan_placement(job)
    assert plan.gpus_of("rollout", 0) == (0, 1)
    placement = RayPlacement(plan, timeout_s=60)
    try:
        trainer = _Probe.options(**actor_options(plan, "trainer", 0, placement)).remote()
        engine_opts = actor_options(plan, "rollout", 0, placement)
        assert engine_opts["num_gpus"] == 0
        engine = _Probe.options(**engine_opts).remote()
        (trainer_gpu,) = ray.get(trainer.gpu_ids.remote())
        visible = ray.get(engine.visible.remote()).split(",")
        assert sorted(visible) == ["0", "1"] and visible[0] == trainer_gpu
        for actor in (trainer, engine):
            ray.kill(actor)
    finally:
        placement.remove()
