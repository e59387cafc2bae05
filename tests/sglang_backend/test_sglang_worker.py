"""SGLangRolloutWorker against the fake engine: refit order, refusals, failures mid-session,
KV scales read back, release/resume. The fake enforces SGLang 0.5.23's rules; this is the API
contract, not a running SGLang."""

from __future__ import annotations

import pytest
import torch
from sglang_helpers import make_engine, make_trainer, perturb, request, samples, sync, tiny_job

from fp8rl.workers.rollout.sglang import SGLangUpdateFailed
from fp8rl.workers.rollout.sglang_adapter import PROBE_LOADER
from fp8rl.workers.rollout.sglang_fake import FakeContractViolation
from fp8rl.workers.weight_sync.layout import engine_tensor
from fp8rl.workers.weight_sync.transport import make_transport
from fp8rl.workers.weight_sync.update import WeightUpdateRefused


@pytest.fixture(scope="module")
def pair():
    """(trainer, engine) with 1 MiB buckets, engine at the trainer's version 1."""
    with pytest.MonkeyPatch.context() as mp:
        job = tiny_job("rollout.weight_bucket_mb=1")
        trainer, engine = make_trainer(job), make_engine(job, mp)
        trainer.version = 1
        sync(trainer, engine)
        yield trainer, engine
        engine.close()


@pytest.fixture(scope="module")
def kv_pair():
    """(trainer, engine) with an FP8 KV cache and SGLang's memory saver on."""
    with pytest.MonkeyPatch.context() as mp:
        job = tiny_job(
            "precision.quant.kv_cache_dtype=fp8_e4m3", "rollout.enable_memory_saver=true"
        )
        trainer, engine = make_trainer(job), make_engine(job, mp)
        perturb(trainer)
        sync(trainer, engine)
        yield trainer, engine
        engine.close()


def test_refit_is_one_session_of_buckets_and_writes_the_trainer_codes(pair):
    trainer, engine = pair
    fake = engine.engine
    perturb(trainer)
    fake.calls.clear()
    update, handle = trainer.publish()
    version = engine.apply_weights(update, handle)
    loads = [c for c in fake.calls if c.startswith("update_weights_from_tensor")]
    assert fake.calls == ["begin_weight_update", *loads, "end_weight_update"]
    assert len(loads) > 1  # 1 MiB buckets: the 12 MiB embedding goes alone, the rest grouped
    assert version == update.version == engine.current_version()
    payload = make_transport("object_store").receive(update, handle, torch.device("cpu"))
    for name in engine.slots:
        assert torch.equal(engine_tensor(fake.model, name), payload[name]), name


def test_refused_update_opens_no_session_and_keeps_weights_and_version(pair):
    trainer, engine = pair
    before = samples(engine.generate(request()))
    version = engine.current_version()
    perturb(trainer)
    update, handle = trainer.publish()
    bad = update.model_copy(
        update={"tensors": [t.model_copy(update={"checksum": "0" * 16}) if i == 3 else t
                            for i, t in enumerate(update.tensors)]}
    )  # fmt: skip
    engine.engine.calls.clear()
    with pytest.raises(WeightUpdateRefused, match="checksum mismatch"):
        engine.apply_weights(bad, handle)
    assert engine.engine.calls == []
    assert engine.current_version() == version
    assert samples(engine.generate(request())) == before


def test_failure_mid_session_reloads_the_last_good_version(pair):
    trainer, engine = pair
    before = samples(engine.generate(request()))
    version = engine.current_version()
    perturb(trainer)
    engine.engine.fail_on = "model.layers.1.mlp.down_proj.weight"
    engine.engine.calls.clear()
    with pytest.raises(SGLangUpdateFailed, match=f"reloaded with version {version}"):
        sync(trainer, engine)
    assert engine.engine.calls.count("begin_weight_update") == 2  # the failed one, the reload
    assert engine.current_version() == version
    assert samples(engine.generate(request())) == before


def test_failed_reload_leaves_an_engine_that_refuses_to_generate(pair, monkeypatch):
    trainer, engine = pair
    fake = engine.engine
    real_load = fake._load

    def always_fail(name, tensor):
        if name == "model.norm.weight":
            raise RuntimeError("disk on fire")
        real_load(name, tensor)

    monkeypatch.setattr(fake, "_load", always_fail)
    perturb(trainer)
    with pytest.raises(SGLangUpdateFailed, match=r"reloading version .* failed too"):
        sync(trainer, engine)
    with pytest.raises(RuntimeError, match="no consistent weights"):
        engine.generate(request())
    monkeypatch.undo()
    sync(trainer, engine)  # a complete update repairs it
    assert engine.generate(request()).samples


def test_kv_scales_are_read_back_after_end_and_equal_what_was_sent(kv_pair):
    trainer, engine = kv_pair
    perturb(trainer)
    engine.engine.calls.clear()
    update, handle = trainer.publish()
    engine.apply_weights(update, handle)
    calls = engine.engine.calls
    end = calls.index("end_weight_update")
    assert calls[end + 1 :] == [
        "begin_weight_update",
        f"update_weights_from_tensor:{PROBE_LOADER}",
        "end_weight_update",
    ]
    sent = {e.name for e in update.tensors if e.role == "kv_scale"}
    assert sent and engine.kv_calibrated
    for name in sent:
        held = engine.engine.kv_params[engine.kv_params[name]]
        expected = float(
            getattr(trainer.model.get_submodule(name.rpartition(".")[0]), name.rpartition(".")[2])
        )
        assert held == expected != 1.0


def test_a_kv_scale_sglang_drops_is_reported_as_its_default(kv_pair, monkeypatch):
    trainer, engine = kv_pair
    fake = engine.engine
    real_load = fake._load
    monkeypatch.setattr(
        fake, "_load", lambda n, t: None if n.endswith(".k_scale") else real_load(n, t)
    )
    for p in fake.kv_params:  # as a fresh engine: never loaded
        fake.kv_params[p] = -1.0
    perturb(trainer)
    with pytest.raises(SGLangUpdateFailed, match="SGLang's default: the scale was not loaded"):
        sync(trainer, engine)
    monkeypatch.undo()
    sync(trainer, engine)
    assert engine.kv_calibrated


def test_release_and_resume_reload_the_last_good_weights(kv_pair):
    trainer, engine = kv_pair
    sync(trainer, engine)
    before = samples(engine.generate(request()))
    engine.release_memory()
    with pytest.raises(FakeContractViolation, match="released"):
        engine.engine.generate(input_ids=[[1, 2]], sampling_params=[{}])
    engine.resume_memory()
    assert engine.engine.calls[-3:] == [
        "begin_weight_update",
        f"update_weights_from_tensor:{PROBE_LOADER}",
        "end_weight_update",
    ]
    assert samples(engine.generate(request())) == before


def test_release_is_not_sent_without_the_memory_saver(pair):
    _, engine = pair
    engine.engine.calls.clear()
    engine.release_memory()
    engine.resume_memory()
    assert engine.engine.calls == []
