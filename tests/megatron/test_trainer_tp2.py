"""MegatronTrainer at TP = 2 (two gloo processes, dense float32) trains like the native trainer:
the TP collectives, the gradient norm (TP-duplicated parameters counted once) and clipping."""

from __future__ import annotations

import json

import pytest
import torch
import torch.multiprocessing as mp
from megatron_configs import TP2_LLAMA, free_port, hf_state
from safetensors.torch import save_file

from fp8rl.protocol import parse_job_spec
from fp8rl.workers.model.scoring import pack
from fp8rl.workers.trainer.batch import TrainBatch
from fp8rl.workers.trainer.worker import TrainerWorker


def _overrides(model_dir) -> list[str]:
    return [
        f"model.path={model_dir}",
        "model.dtype=float32",
        "model.max_model_len=64",
        "precision.mode=bf16",
        "precision.exact=true",
        "trainer.micro_batch_size=2",
        "trainer.lr=1e-3",
        "trainer.grad_clip=0.05",  # small: the clip factor (hence the global norm) matters
        "rollout.n=2",
        "data.prompts_per_step=2",
        "data.max_prompt_tokens=16",
        "rollout.max_tokens=16",
    ]


def _batch() -> TrainBatch:
    g = torch.Generator().manual_seed(4)
    lengths = [(4, 5), (6, 3), (3, 6), (5, 2)]
    packed = pack(
        [torch.randint(0, 256, (p,), generator=g).tolist() for p, _ in lengths],
        [torch.randint(0, 256, (r,), generator=g).tolist() for _, r in lengths],
    )
    zeros = torch.zeros(4, 6)
    return TrainBatch(packed, zeros, zeros, torch.randn(4, 6, generator=g), None, 0, 1.0)


def _rank(rank: int, model_dir: str, port: int, batch: TrainBatch, out: str) -> None:
    torch.set_num_threads(1)
    from fp8rl.workers.trainer.megatron.parallel import shutdown_parallel
    from fp8rl.workers.trainer.megatron.trainer import MegatronTrainer

    job = parse_job_spec(
        "",
        [
            *_overrides(model_dir),
            "trainer.backend=megatron",
            "trainer.tensor_parallel_size=2",
            "trainer.num_workers=2",
        ],
    )
    trainer = MegatronTrainer(
        job.model,
        job.trainer,
        job.algorithm,
        job.precision,
        total_steps=2,
        batch_size=4,
        rank=rank,
        world=2,
        port=port,
        device="cpu",
    )
    try:
        batch.old_logp = batch.rollout_logp = trainer.logprobs(batch)
        metrics = trainer.train(batch)
        after = trainer.logprobs(batch)
        if rank == 0:
            torch.save({"metrics": metrics, "after": after, "before": batch.old_logp}, out)
    finally:
        shutdown_parallel()


@pytest.mark.slow  # ~60 s on 2 cores: two spawned processes import Megatron
def test_tp2_training_step_matches_the_native_trainer(tmp_path):
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    (model_dir / "config.json").write_text(json.dumps(TP2_LLAMA.hf_config()))
    save_file(hf_state(TP2_LLAMA), str(model_dir / "model.safetensors"))
    batch, out = _batch(), str(tmp_path / "rank0.pt")
    mp.start_processes(
        _rank, args=(str(model_dir), free_port(), batch, out), nprocs=2, start_method="spawn"
    )
    result = torch.load(out, weights_only=False)
    job = parse_job_spec("", _overrides(model_dir))
    native = TrainerWorker(
        job.model,
        job.trainer,
        job.algorithm,
        job.precision,
        total_steps=2,
        batch_size=4,
        device="cpu",
    )
    batch.old_logp = batch.rollout_logp = native.logprobs(batch)
    assert (result["before"] - batch.old_logp).abs().max() < 1e-5
    metrics = native.train(batch)
    for key in ("actor/pg_loss", "actor/grad_norm"):
        assert result["metrics"][key] == pytest.approx(metrics[key], rel=1e-4), key
    assert metrics["actor/grad_norm"] > 0.05  # clipping was active
    assert (result["after"] - native.logprobs(batch)).abs().max() < 1e-4
