"""Bitwise parity (precision.exact): the engine's logprob of every sampled token equals the
trainer forward's logprob of the same token ids, for batch sizes 1 and 16, mixed lengths."""

from __future__ import annotations

import pytest
import torch

from fp8rl.protocol import ModelSpec, PrecisionSpec, SamplingParams
from fp8rl.workers.common import load_model
from fp8rl.workers.model.loading import load_tokenizer, resolve_model
from fp8rl.workers.model.scoring import pack, response_logprobs
from fp8rl.workers.rollout.engine import NativeEngine

TEXTS = [
    "What is 12+7?",
    "The capital of France is",
    "Write a haiku about the sea and the wind.",
    "1 2 3",
]


def _generate_and_score(path: str, mode: str, *, exact: bool, max_tokens: int):
    spec = ModelSpec(path=path, max_model_len=256)
    source = resolve_model(path)
    tokenizer = load_tokenizer(source.tokenizer_dir)
    precision = PrecisionSpec(mode=mode, exact=exact)
    engine_model, _ = load_model(
        spec,
        precision,
        role="rollout",
        trainable=False,
        device=torch.device("cpu"),
        seed=0,
        source=source,
    )
    # the trainer's FP32 master weights quantize to the same codes the engine froze (both from FP32)
    trainer_model, _ = load_model(
        spec,
        precision,
        role="trainer",
        trainable=True,
        param_dtype=torch.float32,
        device=torch.device("cpu"),
        seed=0,
        source=source,
    )
    prompts = []
    for t in TEXTS:
        ids = tokenizer.apply_chat_template(
            [{"role": "user", "content": t}], add_generation_prompt=True
        )
        prompts.append(list(ids["input_ids"] if hasattr(ids, "keys") else ids))
    engine = NativeEngine(engine_model, eos_token_ids=source.config.eos_token_id, max_batch_size=16)
    groups = engine.generate(
        prompts, SamplingParams(n=4, temperature=1.0, max_tokens=max_tokens, seed=7)
    )
    samples = [(p, g) for p, gs in zip(prompts, groups, strict=True) for g in gs]
    assert len({len(g.token_ids) for _, g in samples} | {len(p) for p, _ in samples}) > 2, (
        "lengths must be mixed"
    )
    worst = {}
    with torch.no_grad():
        for name, size in (("batch16", 16), ("batch1", 1)):
            diff = 0.0
            for start in range(0, len(samples), size):
                chunk = samples[start : start + size]
                batch = pack([p for p, _ in chunk], [g.token_ids for _, g in chunk])
                logp = response_logprobs(trainer_model, batch, temperature=1.0)
                for row, (_, g) in enumerate(chunk):
                    diff = max(
                        diff,
                        (logp[row, : len(g.logprobs)] - torch.tensor(g.logprobs))
                        .abs()
                        .max()
                        .item(),
                    )
            worst[name] = diff
    return worst


@pytest.mark.parametrize("mode", ["unified_fp8", "bf16"])
def test_tiny_model_parity_is_bitwise_in_exact_mode(mode):
    assert _generate_and_score("random:tiny-llama", mode, exact=True, max_tokens=12) == {
        "batch16": 0.0,
        "batch1": 0.0,
    }


@pytest.mark.slow
def test_smollm2_unified_fp8_parity_is_bitwise_in_exact_mode():
    assert _generate_and_score(
        "builtin:smollm2-135m-instruct", "unified_fp8", exact=True, max_tokens=16
    ) == {"batch16": 0.0, "batch1": 0.0}


def test_fp8_rollout_mode_is_not_bitwise():
    """The control: a BF16 trainer scoring an FP8 engine's samples does not match."""
    worst = _generate_and_score("random:tiny-llama", "fp8_rollout", exact=True, max_tokens=12)
    assert worst["batch16"] > 0
