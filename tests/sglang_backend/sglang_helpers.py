"""Jobs, trainers and fake-SGLang engines for the SGLang backend tests (CPU, random:tiny-llama).

Every engine here is ``FakeSGLangEngine`` (``FP8RL_SGLANG_ENGINE=fake``): these tests check the
backend against SGLang's API contract, not against a running SGLang.
"""

from __future__ import annotations

import torch

SGLANG_TINY = [
    "model.path=random:tiny-llama",
    "model.max_model_len=128",
    "data.max_prompt_tokens=64",
    "rollout.backend=sglang",
    "rollout.max_tokens=6",
    "data.prompts_per_step=2",
    "rollout.n=2",
    "trainer.micro_batch_size=4",
    "precision.mode=unified_fp8",
    "precision.exact=false",
    # tiny-llama's k/v projections have 64 rows: SGLang cannot fuse them in 128x128 FP8 blocks
    "precision.quant.bf16_modules=[embed_tokens, lm_head, q_proj, k_proj, v_proj]",
]


def tiny_job(*overrides: str):
    """The SGLang test job on random:tiny-llama (unified FP8, SGLang-compatible BF16 layers)."""
    from fp8rl.protocol import parse_job_spec

    return parse_job_spec("", [*SGLANG_TINY, *overrides])


def make_trainer(job):
    """A native TrainerWorker for ``job`` (FP32 master weights)."""
    from fp8rl.workers.trainer.worker import TrainerWorker

    return TrainerWorker(
        job.model, job.trainer, job.algorithm, job.precision,
        total_steps=2, batch_size=4, device="cpu", seed=0,
    )  # fmt: skip


def make_engine(job, monkeypatch_env, *, seed: int = 1):
    """An SGLangRolloutWorker on the fake engine (``monkeypatch_env`` sets FP8RL_SGLANG_ENGINE)."""
    from fp8rl.workers.rollout.sglang import ENGINE_ENV, SGLangRolloutWorker

    monkeypatch_env.setenv(ENGINE_ENV, "fake")
    return SGLangRolloutWorker(job.model, job.rollout, job.precision, device="cpu", seed=seed)


def perturb(trainer, scale: float = 0.02) -> None:
    """A new policy version: noise on every parameter, KV scales recalibrated to new values."""
    with torch.no_grad():
        for p in trainer.model.parameters():
            p.add_(torch.randn_like(p) * scale)
        for m in trainer.model.modules():
            if getattr(m, "kv_fp8", False):
                m.k_scale.fill_(0.01 + torch.rand(()).item() * 0.05)
                m.v_scale.fill_(0.01 + torch.rand(()).item() * 0.05)
    trainer._invalidate_fp8()
    trainer.version += 1


def sync(trainer, engine) -> int:
    """Publish the trainer's weights as a version newer than the engine's and apply them."""
    if engine.receiver.version is not None and trainer.version <= engine.current_version():
        trainer.version = engine.current_version() + 1
    update, handle = trainer.publish()
    return engine.apply_weights(update, handle)


def request(seed: int = 7):
    """Two prompts × n=2, seeded (equal weights give equal samples)."""
    from fp8rl.protocol import Prompt, RolloutRequest, SamplingParams

    return RolloutRequest(
        request_id="r",
        prompts=[
            Prompt(prompt_id="a", token_ids=[1, 5, 7]),
            Prompt(prompt_id="b", token_ids=[1, 9]),
        ],
        sampling=SamplingParams(n=2, temperature=1.0, max_tokens=6, seed=seed),
    )


def samples(result) -> list[tuple[list[int], list[float]]]:
    """(token ids, logprobs) of each sample, for equality checks."""
    return [(s.token_ids, s.logprobs) for s in result.samples]
