"""RolloutBackend contract tests every engine passes: the native engine, the vLLM engine (when
vLLM is installed) and the SGLang backend on the fake engine."""

from __future__ import annotations

import importlib.util

import pytest
from sglang_helpers import make_engine, make_trainer, request, samples, sync, tiny_job

from fp8rl.workers.weight_sync.update import WeightUpdateRefused

BACKENDS = ["native", pytest.param("vllm", marks=pytest.mark.vllm), "sglang-fake"]


@pytest.fixture(scope="module", params=BACKENDS)
def pair(request):
    """(trainer, engine) of one backend on the same job, engine at version 1."""
    with pytest.MonkeyPatch.context() as mp:
        if request.param == "native":
            from fp8rl.workers.rollout.worker import RolloutWorker

            job = tiny_job("rollout.backend=native")
            engine = RolloutWorker(job.model, job.rollout, job.precision, device="cpu", seed=1)
        elif request.param == "vllm":
            if importlib.util.find_spec("vllm") is None:
                pytest.skip("vLLM is not installed (pip install '.[vllm]')")
            from fp8rl.workers.rollout.vllm import VLLMRolloutWorker

            job = tiny_job("rollout.backend=vllm")
            engine = VLLMRolloutWorker(job.model, job.rollout, job.precision, device="cpu", seed=1)
        else:
            job = tiny_job()
            engine = make_engine(job, mp)
        trainer = make_trainer(job)
        trainer.version = 1
        sync(trainer, engine)
        yield trainer, engine
        if hasattr(engine, "close"):
            engine.close()


def test_generate_tags_every_sample_with_version_and_fingerprint(pair):
    trainer, engine = pair
    result = engine.generate(request())
    assert [(s.prompt_id, s.sample_index) for s in result.samples] == [
        ("a", 0), ("a", 1), ("b", 0), ("b", 1),
    ]  # fmt: skip
    for s in result.samples:
        assert len(s.token_ids) == len(s.logprobs) and 1 <= len(s.token_ids) <= 6
        assert all(lp <= 0 for lp in s.logprobs)
        assert s.policy_version == engine.current_version() == trainer.version
        assert s.quant_fingerprint == trainer.precision.quant.fingerprint()
        assert s.finish_reason in ("stop", "length")


def test_equal_seeds_and_weights_give_equal_samples(pair):
    _, engine = pair
    assert samples(engine.generate(request(seed=3))) == samples(engine.generate(request(seed=3)))
    assert samples(engine.generate(request(seed=3))) != samples(engine.generate(request(seed=4)))


def test_a_stale_version_is_refused_and_changes_nothing(pair):
    trainer, engine = pair
    before, version = samples(engine.generate(request())), engine.current_version()
    trainer.version = version  # not newer
    update, handle = trainer.publish()
    with pytest.raises(WeightUpdateRefused, match="is not newer"):
        engine.apply_weights(update, handle)
    assert engine.current_version() == version
    assert samples(engine.generate(request())) == before


def test_a_missing_tensor_is_refused_by_name(pair):
    trainer, engine = pair
    trainer.version = engine.current_version() + 1
    update, handle = trainer.publish()
    dropped = update.tensors[-1].name
    short = update.model_copy(update={"tensors": update.tensors[:-1]})
    with pytest.raises(
        WeightUpdateRefused, match=f"{dropped}: in the payload but not in the manifest"
    ):
        engine.apply_weights(short, handle)
