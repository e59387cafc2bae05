"""Weight sync: the engine takes the trainer's exact codes, and refuses bad updates whole."""

from __future__ import annotations

import copy

import pytest
import torch
from tiny import tiny_job

from fp8rl.workers.rollout.worker import RolloutWorker
from fp8rl.workers.trainer.worker import TrainerWorker
from fp8rl.workers.weight_sync.checksum import wsum64
from fp8rl.workers.weight_sync.collective import CollectiveTransport
from fp8rl.workers.weight_sync.object_store import ObjectStoreTransport
from fp8rl.workers.weight_sync.update import WeightUpdateRefused

PROBE = [1, 28, 30, 40, 50, 60]


@pytest.fixture(scope="module")
def pair():

    job = tiny_job("precision.mode=unified_fp8", "precision.exact=true")
    trainer = TrainerWorker(
        job.model,
        job.trainer,
        job.algorithm,
        job.precision,
        total_steps=2,
        batch_size=4,
        device="cpu",
        seed=0,
    )
    engine = RolloutWorker(job.model, job.rollout, job.precision, device="cpu", seed=1)
    update, handle = trainer.publish()
    engine.apply_weights(update, handle)
    return trainer, engine


def _perturb(trainer):
    with torch.no_grad():
        for p in trainer.model.parameters():
            p.add_(torch.randn_like(p) * 0.01)
    trainer.version += 1


def test_engine_holds_the_trainers_exact_fp8_codes(pair):
    trainer, engine = pair
    layer = trainer.model.model.layers[0].self_attn.q_proj
    served = engine.model.model.layers[0].self_attn.q_proj
    q = layer.quantized_weight()
    assert torch.equal(q.codes.view(torch.uint8), served.weight_codes.view(torch.uint8))
    assert torch.equal(q.scale, served.weight_scale)


def test_applying_identical_weights_twice_gives_bit_identical_logits(pair):
    trainer, engine = pair
    _perturb(trainer)
    update, handle = trainer.publish()
    engine.apply_weights(update, handle)
    first = engine.logits(PROBE)
    second_update = update.model_copy(update={"version": update.version + 1})
    engine.apply_weights(second_update, handle)
    assert torch.equal(first, engine.logits(PROBE))


def _refused(engine, update, handle):
    before, version = engine.logits(PROBE), engine.current_version()
    with pytest.raises(WeightUpdateRefused) as info:
        engine.apply_weights(update, handle)
    assert torch.equal(before, engine.logits(PROBE)), (
        "a refused update changed the engine's outputs"
    )
    assert engine.current_version() == version
    return "\n".join(info.value.problems)


def _fresh(pair):
    trainer, engine = pair
    _perturb(trainer)
    update, handle = trainer.publish()
    return engine, update, dict(handle)


def test_missing_tensor_is_refused_naming_it(pair):
    engine, update, handle = _fresh(pair)
    name = "model.layers.1.mlp.down_proj.weight"
    handle.pop(name)
    update = update.model_copy(update={"tensors": [t for t in update.tensors if t.name != name]})
    assert f"{name}: missing from the update" in _refused(engine, update, handle)


def test_extra_tensor_is_refused_naming_it(pair):
    engine, update, handle = _fresh(pair)
    extra = copy.deepcopy(update.tensors[0]).model_copy(update={"name": "model.layers.9.bogus"})
    handle["model.layers.9.bogus"] = handle[update.tensors[0].name]
    update = update.model_copy(update={"tensors": [*update.tensors, extra]})
    assert "model.layers.9.bogus: not a tensor of this model" in _refused(engine, update, handle)


def test_misshaped_tensor_is_refused_naming_it(pair):
    engine, update, handle = _fresh(pair)
    name = "model.norm.weight"
    wrong = torch.ones(129, dtype=torch.bfloat16)
    entries = [
        t.model_copy(update={"shape": [129], "checksum": wsum64(wrong)}) if t.name == name else t
        for t in update.tensors
    ]
    handle[name] = ObjectStoreTransport().send({name: wrong})[name]
    assert f"{name}: shape (129,) but the engine needs (128,)" in _refused(
        engine, update.model_copy(update={"tensors": entries}), handle
    )


def test_wrong_fingerprint_is_refused(pair):
    engine, update, handle = _fresh(pair)
    problems = _refused(engine, update.model_copy(update={"quant_fingerprint": "0" * 16}), handle)
    assert "quant fingerprint 0000000000000000" in problems


def test_bad_checksum_is_refused_naming_the_tensor(pair):
    engine, update, handle = _fresh(pair)
    name = "model.layers.0.self_attn.o_proj.weight"
    corrupted = handle[name].copy()
    corrupted[0] ^= 0x01
    handle[name] = corrupted
    assert f"{name}: checksum mismatch" in _refused(engine, update, handle)


def test_non_increasing_version_is_refused(pair):
    engine, update, handle = _fresh(pair)
    stale = update.model_copy(update={"version": engine.current_version()})
    assert f"version {engine.current_version()} is not newer" in _refused(engine, stale, handle)


def test_zero_scale_is_refused(pair):
    engine, update, handle = _fresh(pair)
    name = "model.layers.0.mlp.up_proj.weight_scale_inv"
    zeros = torch.zeros(
        next(t.shape for t in update.tensors if t.name == name), dtype=torch.float32
    )
    entries = [
        t.model_copy(update={"checksum": wsum64(zeros)}) if t.name == name else t
        for t in update.tensors
    ]
    handle[name] = ObjectStoreTransport().send({name: zeros})[name]
    assert f"{name}: " in _refused(engine, update.model_copy(update={"tensors": entries}), handle)


def test_checksum_is_device_and_order_independent_and_position_sensitive():
    t = torch.arange(1000, dtype=torch.float32)
    assert wsum64(t) == wsum64(t.clone())
    swapped = t.clone()
    swapped[[0, 1]] = swapped[[1, 0]]
    assert wsum64(swapped) != wsum64(t)


def test_collective_transport_broadcasts_every_dtype_over_gloo(tmp_path):
    """The NCCL transport's code path, run with gloo on CPU (two processes)."""
    import torch.multiprocessing as mp

    init = f"file://{tmp_path}/pg"
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    proc = ctx.Process(target=_receiver, args=(init, queue))
    proc.start()
    payload = {
        "codes": torch.tensor([[1.0, -2.0], [448.0, 0.5]]).to(torch.float8_e4m3fn),
        "scale": torch.tensor([0.25, 3.0]),
        "dense": torch.tensor([1.5, -7.25], dtype=torch.bfloat16),
    }
    sender = CollectiveTransport(init_method=init, rank=0, world_size=2, backend="gloo")
    sender.send(payload)
    received = queue.get(timeout=60)
    proc.join(timeout=60)
    sender.close()
    for name, tensor in payload.items():
        assert wsum64(tensor) == received[name], name


def _receiver(init, queue):
    from fp8rl.protocol import TensorEntry, WeightUpdate

    entries = [
        TensorEntry(
            name="codes", role="fp8_weight", shape=[2, 2], dtype="float8_e4m3fn", checksum="x"
        ),
        TensorEntry(name="scale", role="weight_scale", shape=[2], dtype="float32", checksum="x"),
        TensorEntry(name="dense", role="dense", shape=[2], dtype="bfloat16", checksum="x"),
    ]
    update = WeightUpdate(version=1, quant_fingerprint=None, transport="nccl", tensors=entries)
    receiver = CollectiveTransport(init_method=init, rank=1, world_size=2, backend="gloo")
    got = receiver.receive(update, None, torch.device("cpu"))
    queue.put({k: wsum64(v) for k, v in got.items()})
    receiver.close()


def test_fp8_kv_cache_scales_travel_with_the_weights_and_parity_holds():

    from fp8rl.protocol import Prompt, RolloutRequest, SamplingParams
    from fp8rl.workers.model.scoring import pack
    from fp8rl.workers.trainer.batch import TrainBatch

    job = tiny_job("precision.exact=true", "precision.quant.kv_cache_dtype=fp8_e4m3")
    trainer = TrainerWorker(
        job.model,
        job.trainer,
        job.algorithm,
        job.precision,
        total_steps=2,
        batch_size=4,
        device="cpu",
        seed=0,
    )
    engine = RolloutWorker(job.model, job.rollout, job.precision, device="cpu", seed=0)
    with pytest.raises(ValueError, match="not calibrated"):
        engine.logits(PROBE)
    trainer.calibrate_kv(pack([PROBE, PROBE[:3]], [[], []]))
    engine.apply_weights(*trainer.publish())
    attn = engine.model.model.layers[0].self_attn
    assert float(attn.k_scale) > 0 and float(attn.k_scale) == float(
        trainer.model.model.layers[0].self_attn.k_scale
    )
    assert engine.model.model.layers[0].self_attn.kv_fp8
    result = engine.generate(
        RolloutRequest(
            request_id="r",
            prompts=[Prompt(prompt_id="p", token_ids=PROBE)],
            sampling=SamplingParams(n=2, max_tokens=6, seed=1),
        )
    )
    batch = pack(
        [s.prompt_token_ids for s in result.samples], [s.token_ids for s in result.samples]
    )
    rollout = torch.tensor([s.logprobs for s in result.samples])
    train_batch = TrainBatch(
        packed=batch,
        rollout_logp=rollout,
        old_logp=rollout,
        advantages=torch.zeros_like(rollout),
        ref_logp=None,
        policy_version=0,
        temperature=1.0,
    )
    assert torch.equal(trainer.logprobs(train_batch), rollout)


def test_trainer_refuses_a_batch_from_an_older_policy_unless_allowed():
    from fp8rl.workers.model.scoring import pack
    from fp8rl.workers.trainer.batch import TrainBatch

    batch = pack([PROBE], [[5, 6]])
    zeros = torch.zeros(1, 2)
    stale = TrainBatch(
        packed=batch,
        rollout_logp=zeros,
        old_logp=zeros,
        advantages=zeros,
        ref_logp=None,
        policy_version=0,
        temperature=1.0,
    )
    for allowed, ok in ((0, False), (1, True)):
        job = tiny_job(f"algorithm.max_off_policy_steps={allowed}")
        trainer = TrainerWorker(
            job.model,
            job.trainer,
            job.algorithm,
            job.precision,
            total_steps=2,
            batch_size=1,
            device="cpu",
            seed=0,
        )
        trainer.version = 1
        if ok:
            trainer.train(stale)
        else:
            with pytest.raises(ValueError, match="policy version 0, trainer is at 1"):
                trainer.train(stale)
