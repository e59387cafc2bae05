"""MegatronTrainer with two data-parallel replicas (two gloo processes, dense float32): each rank
gets the driver's shard of its replica (``services.step_batch.trainer_shards``) and the step
equals the one-rank native trainer's on the whole batch (gradients summed over DP, global loss
denominator, metrics reduced over DP). Ranks join through ``defer`` + ``join``, as the Ray
driver starts them; both write one DCP checkpoint and restore it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp
from megatron_configs import TP2_LLAMA, free_port, hf_state
from safetensors.torch import save_file

from fp8rl.protocol import parse_job_spec
from fp8rl.services.checkpoint import _consolidate
from fp8rl.workers.model.scoring import pack
from fp8rl.workers.trainer.batch import TrainBatch
from fp8rl.workers.trainer.worker import TrainerWorker

ROWS = 6


def _overrides(model_dir) -> list[str]:
    return [
        f"model.path={model_dir}",
        "model.dtype=float32",
        "model.max_model_len=64",
        "precision.mode=bf16",
        "precision.exact=true",
        "trainer.micro_batch_size=2",
        "trainer.lr=1e-3",
        "rollout.n=2",
        "data.prompts_per_step=3",
        "data.max_prompt_tokens=16",
        "rollout.max_tokens=16",
    ]


def _batch() -> TrainBatch:
    g = torch.Generator().manual_seed(5)
    lengths = [(4, 5), (6, 3), (3, 6), (5, 2), (7, 4), (2, 6)]
    packed = pack(
        [torch.randint(0, 256, (p,), generator=g).tolist() for p, _ in lengths],
        [torch.randint(0, 256, (r,), generator=g).tolist() for _, r in lengths],
    )
    zeros = torch.zeros(ROWS, 6)
    return TrainBatch(packed, zeros, zeros, torch.randn(ROWS, 6, generator=g), None, 0, 1.0)


def _rank(rank: int, model_dir: str, port: int, batch: TrainBatch, out: str) -> None:
    torch.set_num_threads(1)
    from fp8rl.services.step_batch import trainer_shards
    from fp8rl.workers.trainer.megatron.parallel import shutdown_parallel
    from fp8rl.workers.trainer.megatron.trainer import MegatronTrainer

    job = parse_job_spec(
        "", [*_overrides(model_dir), "trainer.backend=megatron", "trainer.num_workers=2"]
    )
    trainer = MegatronTrainer(
        job.model,
        job.trainer,
        job.algorithm,
        job.precision,
        total_steps=2,
        batch_size=ROWS,
        rank=rank,
        world=2,
        device="cpu",
        defer=True,
    )
    trainer.join(f"tcp://127.0.0.1:{port}")
    try:
        shards = trainer_shards(batch, job)
        mine = shards[rank]
        assert trainer.layout.dp == 2 and len(mine.batch) == ROWS // 2
        with pytest.raises(ValueError, match="data-parallel replicas"):
            trainer.train(batch)  # a whole batch is refused with DP > 1
        before = trainer.logprobs(mine)
        batch.old_logp = batch.rollout_logp = torch.zeros_like(batch.old_logp)
        batch.old_logp[mine.index, : before.shape[1]] = before
        shards = trainer_shards(batch, job)  # the driver's shards, old_logp filled in
        metrics = trainer.train(shards[rank])
        after = trainer.logprobs(shards[rank])
        checkpoint = Path(out).parent / "checkpoint"  # both ranks write one DCP checkpoint
        files = trainer.save(checkpoint)
        shards[rank].batch.policy_version = trainer.version
        trainer.train(shards[rank])
        restored = (trainer.load(checkpoint), trainer.logprobs(shards[rank]))
        torch.save(
            {
                "metrics": metrics,
                "before": before,
                "after": after,
                "index": mine.index,
                "files": files,
                "restored": restored,
            },
            out.replace(".pt", f"{rank}.pt"),
        )
    finally:
        shutdown_parallel()


@pytest.mark.slow  # ~60 s on 2 cores: two spawned processes import Megatron
def test_dp2_shards_train_like_the_one_rank_native_trainer(tmp_path):
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    (model_dir / "config.json").write_text(json.dumps(TP2_LLAMA.hf_config()))
    save_file(hf_state(TP2_LLAMA), str(model_dir / "model.safetensors"))
    batch, out = _batch(), str(tmp_path / "rank.pt")
    mp.start_processes(
        _rank, args=(str(model_dir), free_port(), batch, out), nprocs=2, start_method="spawn"
    )
    results = [torch.load(out.replace(".pt", f"{r}.pt"), weights_only=False) for r in range(2)]
    assert sorted(torch.cat([r["index"] for r in results]).tolist()) == list(range(ROWS))
    job = parse_job_spec("", _overrides(model_dir))
    native = TrainerWorker(
        job.model, job.trainer, job.algorithm, job.precision, total_steps=2, batch_size=ROWS
    )
    batch.old_logp = batch.rollout_logp = native.logprobs(batch)
    for r in results:
        got = r["before"]
        assert (got - batch.old_logp[r["index"], : got.shape[1]]).abs().max() < 1e-5
    metrics = native.train(batch)
    after = native.logprobs(batch)
    for r in results:  # both replicas report the DP-reduced metrics
        for key in ("actor/pg_loss", "actor/entropy", "actor/grad_norm"):
            assert r["metrics"][key] == pytest.approx(metrics[key], rel=1e-4), key
        got = r["after"]
        assert (got - after[r["index"], : got.shape[1]]).abs().max() < 1e-4
    assert metrics["actor/grad_norm"] > 0
    for rank, r in enumerate(results):  # each rank restored the checkpoint both wrote
        assert f"trainer/rank_{rank}.pt" in r["files"]
        version, logp = r["restored"]
        assert version == 1 and torch.equal(logp, r["after"])
    weights = _consolidate(tmp_path / "checkpoint" / "trainer")  # the masters, stored once
    assert sorted(weights) == sorted(native.model_weights())
