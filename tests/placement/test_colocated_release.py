"""Colocated engines free their memory while the trainer ranks beside them train, and only then
(RolloutBackend.release_memory / resume_memory through Workers)."""

from __future__ import annotations

from pathlib import Path

import pytest

from fp8rl.protocol import load_job_spec
from fp8rl.services import runtime
from fp8rl.services.placement import plan_placement
from fp8rl.services.runtime import Workers

JOBS = Path(__file__).parents[2] / "deploy" / "jobs"
LLAMA_8GPU = JOBS / "llama3.1-8b-gsm8k-math-8gpu.yaml"


class _Engine:
    """Records release/resume calls like a Ray actor handle would receive them."""

    def __init__(self, log: list[str], rank: int) -> None:
        for name in ("release_memory", "resume_memory"):
            method = type("M", (), {"remote": lambda self, n=name: log.append(f"{n}[{rank}]")})
            setattr(self, name, method())


@pytest.fixture
def calls(monkeypatch) -> list[str]:
    monkeypatch.setattr(runtime.ray, "get", lambda refs: refs)
    return []


def _workers(plan, log: list[str], engines: int) -> Workers:
    rollout = [_Engine(log, i) for i in range(engines)]
    return Workers(trainers=[], rollout=rollout, reward=None, plan=plan)


def test_engines_on_trainer_gpus_release_and_resume_every_engine(calls):
    job = load_job_spec(LLAMA_8GPU)
    workers = _workers(plan_placement(job), calls, job.rollout.num_workers)
    assert workers.engines_share_gpus
    workers.release_engines()
    workers.resume_engines()
    n = job.rollout.num_workers
    assert calls == [f"release_memory[{i}]" for i in range(n)] + [
        f"resume_memory[{i}]" for i in range(n)
    ]


def test_a_hybrid_engine_on_cpu_releases_and_resumes(calls):
    job = load_job_spec(JOBS / "quickstart.yaml")  # resources.hybrid_engine: true
    workers = _workers(plan_placement(job), calls, 1)
    workers.hybrid = job.resources.hybrid_engine
    workers.release_engines()
    workers.resume_engines()
    assert calls == ["release_memory[0]", "resume_memory[0]"]


def test_engines_on_their_own_gpus_or_on_cpu_keep_their_memory(calls):
    apart = load_job_spec(LLAMA_8GPU, ["resources.placement=disaggregated"])
    cpu = load_job_spec(JOBS / "quickstart.yaml", ["resources.hybrid_engine=false"])
    for job in (apart, cpu):
        workers = _workers(plan_placement(job), calls, job.rollout.num_workers)
        assert not workers.engines_share_gpus
        workers.release_engines()
        workers.resume_engines()
    assert calls == []
