"""Refit from a WeightUpdate: exact, idempotent, all or nothing, and no stale lm_head copy."""

from __future__ import annotations

import pytest
import torch
from vllm_helpers import make_engine, needs_vllm, perturb, sync

from fp8rl.protocol import Prompt, RolloutRequest, SamplingParams
from fp8rl.workers.model.scoring import pack, response_logprobs
from fp8rl.workers.weight_sync.update import WeightUpdateRefused

needs_vllm()
pytestmark = pytest.mark.vllm

PROBE = ([1, 28, 30, 40, 50], [60, 70, 80, 90, 100, 110])
REQUEST = RolloutRequest(
    request_id="refit",
    prompts=[Prompt(prompt_id="p", token_ids=PROBE[0])],
    sampling=SamplingParams(n=2, temperature=1.0, max_tokens=6, seed=3),
)


def _outputs(engine) -> tuple[list[float], list[list[int]], list[list[float]]]:
    """Everything observable: scored probe logprobs and seeded samples with their logprobs."""
    result = engine.generate(REQUEST)
    return (
        engine.score(*PROBE),
        [s.token_ids for s in result.samples],
        [s.logprobs for s in result.samples],
    )


def _trainer_probe(trainer) -> list[float]:
    batch = pack([PROBE[0]], [PROBE[1]])
    with torch.no_grad():
        return response_logprobs(trainer.model, batch, temperature=1.0)[0].tolist()


@pytest.fixture(scope="session")
def fresh_engine(unified):
    """A second engine of the same job, for 'as a fresh engine would' comparisons."""
    job, _, _ = unified
    engine = make_engine(job, seed=1)
    yield engine
    engine.close()


def test_refit_changes_outputs_exactly_as_a_fresh_engine_on_the_new_weights(unified, fresh_engine):
    _, trainer, engine = unified
    sync(trainer, engine)
    before = _outputs(engine)
    perturb(trainer)
    update, handle = trainer.publish()
    assert engine.apply_weights(update, handle) == trainer.version
    assert fresh_engine.apply_weights(update, handle) == trainer.version
    after = _outputs(engine)
    assert after != before
    assert after == _outputs(fresh_engine)
    assert engine.weight_checksums() == fresh_engine.weight_checksums()
    assert max(abs(a - b) for a, b in zip(after[0], _trainer_probe(trainer), strict=True)) <= 2e-6


def test_applying_the_same_weights_twice_gives_bit_identical_logits(unified):
    _, trainer, engine = unified
    perturb(trainer)
    sync(trainer, engine)
    once, sums = _outputs(engine), engine.weight_checksums()
    trainer.version += 1  # same tensors, next version
    sync(trainer, engine)
    assert engine.weight_checksums() == sums
    assert _outputs(engine) == once


def test_a_refit_of_the_tied_embedding_reaches_the_lm_head(unified):
    _, trainer, engine = unified
    sync_before = _outputs(engine)[0]
    perturb(trainer, only="model.embed_tokens.weight", scale=0.05)
    sync(trainer, engine)
    scored = engine.score(*PROBE)
    assert scored != sync_before
    assert max(abs(a - b) for a, b in zip(scored, _trainer_probe(trainer), strict=True)) <= 2e-6


def _corrupt(update, payload, how: str):
    """A copy of (update, payload) broken in one way."""
    entries = list(update.tensors)
    payload = dict(payload)
    fp8 = next(i for i, e in enumerate(entries) if e.role == "fp8_weight")
    scale = next(i for i, e in enumerate(entries) if e.role == "weight_scale")
    if how == "stale_version":
        return update.model_copy(update={"version": 0}), payload
    if how == "other_fingerprint":
        return update.model_copy(update={"quant_fingerprint": "0" * 16}), payload
    if how == "missing_tensor":
        name = entries.pop(fp8).name
        payload.pop(name)
    elif how == "extra_tensor":
        extra = entries[0].model_copy(update={"name": "model.extra.weight"})
        entries.append(extra)
        payload[extra.name] = payload[entries[0].name]
    elif how == "wrong_shape":
        e = entries[fp8]
        t = payload[e.name][:-1]
        entries[fp8] = e.model_copy(update={"shape": list(t.shape)})
        payload[e.name] = t
    elif how == "wrong_dtype":
        e = entries[fp8]
        payload[e.name] = payload[e.name].to(torch.bfloat16)
        entries[fp8] = e.model_copy(update={"dtype": "bfloat16"})
    elif how == "zero_scale":
        from fp8rl.workers.weight_sync.checksum import wsum64

        e = entries[scale]
        t = payload[e.name].clone()
        t.view(-1)[0] = 0.0
        payload[e.name] = t
        entries[scale] = e.model_copy(update={"checksum": wsum64(t)})
    elif how == "checksum_mismatch":
        e = entries[scale]
        payload[e.name] = payload[e.name] * 2
    elif how == "other_scale_format":
        e = entries[scale]
        entries[scale] = e.model_copy(update={"scale_format": "pow2"})
    elif how == "other_block_size":
        e = entries[fp8]
        entries[fp8] = e.model_copy(update={"block_size": [1, 128]})
    return update.model_copy(update={"tensors": entries}), payload


REASONS = [
    ("stale_version", "not newer"),
    ("other_fingerprint", "quant fingerprint"),
    ("missing_tensor", "missing from the update"),
    ("extra_tensor", "not a tensor of this model"),
    ("wrong_shape", "shape"),
    ("wrong_dtype", "dtype"),
    ("zero_scale", "zero, negative or not finite"),
    ("checksum_mismatch", "checksum mismatch"),
    ("other_scale_format", "scale format"),
    ("other_block_size", "block size"),
]


@pytest.fixture(scope="module")
def good_update(unified):
    """A valid next update (weights perturbed) that no test applies."""
    _, trainer, engine = unified
    sync(trainer, engine)
    perturb(trainer)
    return _publish_tensors(trainer)


def _publish_tensors(trainer):
    from fp8rl.workers.weight_sync.update import build_update

    return build_update(
        trainer.model,
        receiver=trainer.receivers["rollout"],
        version=trainer.version,
        fingerprint=trainer.precision.quant.fingerprint(),
    )


@pytest.mark.parametrize("how,reason", REASONS)
def test_a_refused_update_leaves_weights_outputs_and_version_unchanged(
    unified, good_update, how, reason
):
    from fp8rl.workers.weight_sync.object_store import ObjectStoreTransport

    _, _, engine = unified
    version, sums, scored = (
        engine.current_version(),
        engine.weight_checksums(),
        engine.score(*PROBE),
    )
    update, payload = _corrupt(*good_update, how)
    with pytest.raises(WeightUpdateRefused, match=reason):
        engine.apply_weights(update, ObjectStoreTransport().send(payload))
    assert engine.current_version() == version
    assert engine.weight_checksums() == sums
    assert engine.score(*PROBE) == scored


def test_the_intact_update_is_then_accepted(unified, good_update):
    from fp8rl.workers.weight_sync.object_store import ObjectStoreTransport

    _, _, engine = unified
    update, payload = good_update
    assert engine.apply_weights(update, ObjectStoreTransport().send(payload)) == update.version


@pytest.fixture(scope="session")
def stock_engine(tmp_path_factory):
    """Plain vLLM (no fp8rl quantization: vLLM's own CPU methods, which repack weights) on
    random:tiny-llama (tied embeddings), with fp8rl's worker extension."""
    import json
    import os

    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # in-process: callables reach the worker
    from vllm import LLM

    from fp8rl.workers.model.config import PRESETS
    from fp8rl.workers.rollout.vllm import EXTENSION

    folder = tmp_path_factory.mktemp("stock")
    (folder / "config.json").write_text(json.dumps(PRESETS["tiny-llama"].hf_config()))
    return LLM(
        model=str(folder),
        skip_tokenizer_init=True,
        load_format="dummy",
        dtype="bfloat16",
        max_model_len=64,
        distributed_executor_backend="uni",
        worker_extension_cls=EXTENSION,
        enforce_eager=True,
        kv_cache_memory_bytes=1 << 24,
    )


def _head_logits(worker, hidden):
    model = worker.model_runner.get_model()
    return model.lm_head.quant_method.apply(model.lm_head, hidden).float()


def _load_plain(worker, payload):
    worker.model_runner.get_model().load_weights(iter(payload.items()))


def test_vllm_own_lm_head_copy_is_refreshed_by_the_refit(stock_engine):
    """The trap: vLLM's CPU lm_head computes from a repacked copy; a refit of the tied
    embedding must rebuild it, or the logits stay those of the old weights."""
    torch.manual_seed(0)
    hidden = torch.randn(3, 128).to(torch.bfloat16)
    new = {"model.embed_tokens.weight": torch.randn(49152, 128).to(torch.bfloat16) * 0.05}
    expected = torch.nn.functional.linear(hidden.float(), new["model.embed_tokens.weight"].float())
    stale = stock_engine.collective_rpc(_head_logits, args=(hidden,))[0]
    stock_engine.collective_rpc(_load_plain, args=(new,))  # plain load_weights: the trap
    assert torch.equal(stock_engine.collective_rpc(_head_logits, args=(hidden,))[0], stale)
    result = stock_engine.collective_rpc("fp8rl_load_weights", args=(new,))[0]
    assert "lm_head" in result["refreshed"]
    fresh = stock_engine.collective_rpc(_head_logits, args=(hidden,))[0]
    assert torch.allclose(fresh, expected, atol=2e-2, rtol=2e-2)
    assert not torch.allclose(fresh, stale, atol=2e-2, rtol=2e-2)
