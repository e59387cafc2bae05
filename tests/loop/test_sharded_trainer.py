"""FSDP2 trainer ranks (gloo, CPU, exact mode) against one unsharded trainer on the same batch.

Tolerance: logprobs and the policy loss are bitwise/1e-6 equal (exact mode's forward is
batch-invariant, sharding only moves where weights live). The grad norm agrees within 1e-4
relative with an FP32 trainer: each rank sums its own micro-batches' gradients and the
reduce-scatter adds the ranks' sums, a different float summation order than one process
accumulating every micro-batch. Sharding also changes which rows share a micro-batch; an FP8
trainer's WGrad quantizes gradients in groups of 128 tokens of a micro-batch, so there the grad
norm moves by FP8 rounding (allowed 5e-3).
"""

from __future__ import annotations

import pytest
import ray
import torch
from tiny import tiny_job

from fp8rl.workers.model.scoring import pack
from fp8rl.workers.ports import free_port
from fp8rl.workers.trainer.batch import TrainBatch
from fp8rl.workers.trainer.worker import TrainerWorker, shard_batch
from fp8rl.workers.weight_sync.object_store import ObjectStoreTransport

pytestmark = pytest.mark.slow  # ~1-4 min on 2 shared cores: 6 trainer processes

BASE = (
    "model.path=random:tiny-qwen3",  # hidden 192, intermediate 320: shards are not 128-aligned
    "precision.exact=true",
    "trainer.micro_batch_size=2",
    "trainer.mini_batch_size=8",  # one optimizer step per train call: metrics of the same weights
    "data.prompts_per_step=4",
    "rollout.n=2",
)
MODES = {
    # FP8 trainer: WGrad quantizes ∇Y in groups of 128 tokens of a micro-batch, so another
    # micro-batch composition (another rank count) moves the gradient by FP8 rounding (~1e-3)
    "unified_fp8": (
        ("precision.mode=unified_fp8", "precision.quant.kv_cache_dtype=fp8_e4m3"),
        5e-3,
    ),
    # FP32 trainer, FP8 engines: only float summation order differs. (A BF16 trainer rounds
    # each micro-batch's weight gradient to BF16, so a different composition moves it ~5e-4.)
    "fp8_rollout_fp32": (("precision.mode=fp8_rollout", "model.dtype=float32"), 1e-4),
}


@pytest.fixture(scope="module", autouse=True)
def local_ray():
    ray.init(address="local", num_cpus=2, include_dashboard=False)
    yield
    ray.shutdown()


def _ranks(job, n: int, *, sharded: bool = True) -> list:
    actor = ray.remote(TrainerWorker).options(num_cpus=0)
    args = (job.model, job.trainer, job.algorithm, job.precision)
    kw = {"total_steps": 4, "batch_size": job.batch_size, "device": "cpu", "seed": 0}
    if not sharded:
        return [actor.remote(*args, **kw)]
    init = f"tcp://127.0.0.1:{free_port()}"
    return [actor.remote(*args, **kw, rank=r, world_size=n, init_method=init) for r in range(n)]


def _batch(version: int = 0) -> TrainBatch:
    gen = torch.Generator().manual_seed(0)
    lengths = [(5, 7), (9, 3), (4, 8), (12, 6), (3, 2), (7, 9), (6, 5), (10, 4)]
    prompts = [torch.randint(5, 500, (p,), generator=gen).tolist() for p, _ in lengths]
    responses = [torch.randint(5, 500, (r,), generator=gen).tolist() for _, r in lengths]
    packed = pack(prompts, responses)
    shape = packed.response_ids.shape
    return TrainBatch(
        packed=packed,
        rollout_logp=torch.zeros(shape),
        old_logp=None,
        advantages=torch.randn(shape, generator=gen) * packed.response_mask,
        ref_logp=None,
        policy_version=version,
        temperature=1.0,
    )


def _call(ranks: list, method: str, batch: TrainBatch) -> list:
    shards = shard_batch(
        batch, ranks=len(ranks), mini_batch_size=8, micro_batch_size=2, loss_agg="token_mean"
    )
    results = ray.get([getattr(r, method).remote(s) for r, s in zip(ranks, shards, strict=True)])
    if method != "logprobs":
        return results
    out = torch.zeros(batch.packed.response_ids.shape)
    for shard, logp in zip(shards, results, strict=True):
        out[shard.index, : logp.shape[1]] = logp
    return out


def _payload(ranks: list) -> dict[str, torch.Tensor]:
    published = ray.get([r.publish.remote() for r in ranks])
    update, handle = published[0]
    assert all(p == (None, None) for p in published[1:])
    return ObjectStoreTransport().receive(update, handle, torch.device("cpu"))


def _step(ranks: list, batch: TrainBatch) -> tuple[torch.Tensor, dict[str, float]]:
    prompts = [
        row[: int(n)].tolist()
        for row, n in zip(batch.packed.input_ids, batch.packed.prompt_lengths, strict=True)
    ]
    from fp8rl.workers.model.scoring import pack as _pack

    ray.get([r.calibrate_kv.remote(_pack(prompts, [[] for _ in prompts])) for r in ranks])
    logp = _call(ranks, "logprobs", batch)
    batch.old_logp = logp
    return logp, _call(ranks, "train", batch)[0]


def _assert_same_payload(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for name in a:
        assert a[name].dtype == b[name].dtype, name
        assert torch.equal(
            a[name].reshape(-1).view(torch.uint8), b[name].reshape(-1).view(torch.uint8)
        ), name


@pytest.mark.parametrize("mode", list(MODES))
def test_two_ranks_match_one_rank_and_publish_the_same_codes(tmp_path, mode):
    overrides, rel = MODES[mode]
    job = tiny_job(*BASE, *overrides)
    one, two = _ranks(job, 1, sharded=False), _ranks(job, 2)
    _assert_same_payload(_payload(one), _payload(two))  # version 0: same master weights
    logp1, m1 = _step(one, _batch())
    logp2, m2 = _step(two, _batch())
    assert torch.equal(logp1, logp2)
    assert m2["actor/pg_loss"] == pytest.approx(m1["actor/pg_loss"], rel=1e-6)
    assert m2["actor/grad_norm"] == pytest.approx(m1["actor/grad_norm"], rel=rel)
    for actor in one:  # the node's memory is shared: keep few trainer processes alive
        ray.kill(actor)
    # rank shards → a different rank count (2 → 1 unsharded, 2 → 3 sharded): same weights, so
    # the same FP8 codes and scales (non-aligned shards at 3 ranks), and the same next step
    ray.get([r.save.remote(tmp_path) for r in two])
    after = _payload(two)
    for others in (_ranks(job, 1, sharded=False), _ranks(job, 3)):
        assert ray.get([r.load.remote(tmp_path) for r in others]) == [1] * len(others)
        _assert_same_payload(after, _payload(others))
        if len(others) == 1:
            ray.kill(others[0])
    logp3, m3 = _step(two, _batch(1))
    logp4, m4 = _step(others, _batch(1))  # 3 ranks: 3+3+2 rows, one empty micro-batch
    assert torch.equal(logp3, logp4)
    assert m4["actor/pg_loss"] == pytest.approx(m3["actor/pg_loss"], rel=1e-6)
    assert m4["actor/grad_norm"] == pytest.approx(m3["actor/grad_norm"], rel=rel)
