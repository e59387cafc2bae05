"""Rollout across N engines: per-sequence seeded streams (samples do not depend on the engine
count or the batch), least-loaded dispatch, one policy version per batch."""

from __future__ import annotations

import pytest
import torch
from tiny import tiny_job

from fp8rl.protocol import RolloutResult, SamplingParams
from fp8rl.services import rollout_phase
from fp8rl.services.rollout_phase import assign_least_loaded, check_one_policy_version, generate
from fp8rl.workers.rollout.sampling import counter_uniforms, inverse_cdf_sample, sequence_seed
from fp8rl.workers.rollout.worker import RolloutWorker

PROMPTS = [
    ("a", [1, 17, 300, 42]),
    ("b", [1, 5]),
    ("c", [1, 900, 901, 902, 903, 904, 905]),
    ("d", [1, 77, 78]),
    ("e", [1, 4000]),
]


def test_a_rows_uniform_depends_only_on_its_seed_and_step():
    seeds = torch.tensor([sequence_seed(3, i) for i in range(6)])
    alone = torch.cat([counter_uniforms(seeds[i : i + 1], 5) for i in range(6)])
    assert torch.equal(counter_uniforms(seeds, 5), alone)
    assert torch.equal(counter_uniforms(seeds.flip(0), 5), alone.flip(0))
    assert not torch.equal(counter_uniforms(seeds, 6), alone)


def test_inverse_cdf_sampling_follows_the_probabilities_and_skips_zero_mass_tokens():
    probs = torch.tensor([0.2, 0.0, 0.5, 0.3]).expand(200_000, 4)
    u = counter_uniforms(torch.tensor([sequence_seed(9, i) for i in range(200_000)]), 0)
    counts = torch.bincount(inverse_cdf_sample(probs, u), minlength=4) / 200_000
    assert counts[1] == 0
    assert torch.allclose(
        counts, torch.tensor([0.2, 0.0, 0.5, 0.3], dtype=counts.dtype), atol=0.005
    )


def test_least_loaded_dispatch_balances_costs_and_is_deterministic():
    costs = [9.0, 7.0, 6.0, 5.0, 4.0, 3.0]
    owner = assign_least_loaded(costs, 2)
    load = [sum(c for c, o in zip(costs, owner, strict=True) if o == r) for r in range(2)]
    assert sorted(load) == [17.0, 17.0]
    assert owner == assign_least_loaded(costs, 2)
    assert assign_least_loaded(costs, 1) == [0] * 6
    assert set(assign_least_loaded([1.0, 1.0], 4)) == {0, 1}  # idle engines get no request


def test_results_from_engines_at_different_policy_versions_are_refused():
    check_one_policy_version({0: 3, 1: 3})
    with pytest.raises(RuntimeError, match=r"rollout\[0\] at v3, rollout\[1\] at v2"):
        check_one_policy_version({0: 3, 1: 2})


class _InProcess:
    """A RolloutWorker called like an actor handle (``engine.generate.remote``), in this process."""

    def __init__(self, worker: RolloutWorker, *, version: int | None = None) -> None:
        self.worker, self.calls = worker, []
        self.generate = self
        self.version = version

    def remote(self, request):
        self.calls.append(len(request.prompts))
        result = self.worker.generate(request)
        if self.version is not None:
            result = RolloutResult(**{**result.model_dump(), "policy_version": self.version})
        return result


@pytest.fixture(scope="module")
def workers():
    job = tiny_job("precision.mode=bf16", "precision.exact=true", "rollout.max_batch_size=4")
    return [
        RolloutWorker(job.model, job.rollout, job.precision, device="cpu", rank=r, seed=0)
        for r in range(2)
    ]


def _samples(monkeypatch, engines):
    monkeypatch.setattr(rollout_phase.ray, "get", lambda refs: refs)  # in-process "actors"
    sampling = SamplingParams(n=3, temperature=1.0, max_tokens=6, seed=11)
    samples = generate(engines, PROMPTS, sampling, request_id="t")
    return [(s.prompt_id, s.sample_index, s.token_ids, s.logprobs) for s in samples]


def test_samples_are_identical_with_one_and_two_engines(monkeypatch, workers):
    one = _samples(monkeypatch, [_InProcess(workers[0])])
    two_engines = [_InProcess(w) for w in workers]
    two = _samples(monkeypatch, two_engines)
    assert all(e.calls for e in two_engines), "both engines must have been used"
    assert one == two
    assert len({tuple(t) for _, _, t, _ in one}) > len(PROMPTS), "samples of a prompt must differ"


def test_a_batch_from_engines_at_different_versions_is_refused(monkeypatch, workers):
    engines = [_InProcess(workers[0], version=1), _InProcess(workers[1], version=2)]
    with pytest.raises(RuntimeError, match="different policy versions"):
        _samples(monkeypatch, engines)
