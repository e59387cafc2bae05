"""vLLM ↔ trainer parity: the logprob vLLM reports for each sampled token is the trainer's.

The trainer scores the engine's token ids with ``pack`` + ``response_logprobs`` on its own
(FP32-master, FP8Linear) decoder. With fp8rl's plugin the logits are bitwise the trainer's, so the
only difference left is the log-softmax dtype (vLLM float32, the exact trainer float64): zero
against the trainer's logits reduced in float32, ≤ 1 float32 ulp of |logp| against float64.
"""

from __future__ import annotations

import pytest
import torch
from vllm_helpers import needs_vllm

from fp8rl.kernels.invariant import token_logprobs
from fp8rl.protocol import Prompt, RolloutRequest, SamplingParams
from fp8rl.workers.model.scoring import pack, response_hidden, response_logprobs

needs_vllm()
pytestmark = pytest.mark.vllm

PROMPTS = [[1, 28, 30, 40, 50], [1, 300, 7, 9000, 12, 44, 45]]


def _request(temperature: float, *, max_tokens: int = 8, n: int = 2, stop=()) -> RolloutRequest:
    return RolloutRequest(
        request_id="parity",
        prompts=[Prompt(prompt_id=str(i), token_ids=p) for i, p in enumerate(PROMPTS)],
        sampling=SamplingParams(
            n=n, temperature=temperature, max_tokens=max_tokens, seed=7, stop_token_ids=list(stop)
        ),
    )


def _deltas(trainer, result, temperature: float) -> tuple[float, float]:
    """(max |Δ| vs the exact trainer, max |Δ| vs the trainer's logits in float32)."""
    samples = result.samples
    batch = pack([s.prompt_token_ids for s in samples], [s.token_ids for s in samples])
    with torch.no_grad():
        exact = response_logprobs(trainer.model, batch, temperature=temperature)
        logits = trainer.model.logits(response_hidden(trainer.model, batch))
        fp32 = token_logprobs(logits, batch.response_ids, temperature=temperature, exact=False)
    engine = torch.zeros_like(exact)
    for i, s in enumerate(samples):
        engine[i, : len(s.logprobs)] = torch.tensor(s.logprobs)
    mask = batch.response_mask
    return (
        float((engine - exact).abs()[mask].max()),
        float((engine - fp32).abs()[mask].max()),
    )


@pytest.mark.parametrize("temperature", [1.0, 0.7, 0.0])
def test_sampled_token_logprobs_equal_the_trainer_forward(unified, temperature):
    _, trainer, engine = unified
    sync_version = engine.current_version()
    result = engine.generate(_request(temperature))
    assert result.policy_version == sync_version and result.backend == "vllm"
    to_exact, to_fp32 = _deltas(trainer, result, temperature)
    assert to_fp32 == 0.0  # bitwise the trainer's logits, same float32 reduction
    assert to_exact <= 2e-6  # float32 vs float64 log-softmax


def test_bf16_mode_logprobs_equal_the_trainer_forward(bf16_pair):
    _, trainer, engine = bf16_pair
    result = engine.generate(_request(1.0))
    assert result.quant_fingerprint is None
    to_exact, to_fp32 = _deltas(trainer, result, 1.0)
    assert to_fp32 == 0.0 and to_exact <= 2e-6


def test_results_carry_version_fingerprint_and_one_logprob_per_token(unified):
    job, _, engine = unified
    result = engine.generate(_request(1.0))
    assert len(result.samples) == len(PROMPTS) * 2
    assert [s.sample_index for s in result.samples] == [0, 1, 0, 1]
    for s in result.samples:
        assert s.quant_fingerprint == job.precision.quant.fingerprint()
        assert len(s.logprobs) == len(s.token_ids) and s.policy_version == engine.current_version()


def test_a_response_cut_at_max_tokens_keeps_its_last_token_and_says_length(unified):
    _, _, engine = unified
    result = engine.generate(_request(0.0, max_tokens=5, n=1))
    for s in result.samples:
        assert len(s.token_ids) == 5 and s.finish_reason == "length"


def test_a_stop_token_ends_the_response_is_kept_and_says_stop(unified):
    _, _, engine = unified
    greedy = engine.generate(_request(0.0, max_tokens=6, n=1)).samples[0].token_ids
    cut = next(i for i, t in enumerate(greedy) if t not in greedy[:i])  # first occurrence
    stop = greedy[max(cut, 2)]
    stopped = engine.generate(_request(0.0, max_tokens=6, n=1, stop=[stop])).samples[0]
    assert stopped.finish_reason == "stop"
    assert stopped.token_ids == greedy[: greedy.index(stop) + 1]


def test_equal_seeds_give_equal_samples_and_n_samples_differ(unified):
    _, _, engine = unified
    a, b = engine.generate(_request(1.0)), engine.generate(_request(1.0))
    assert [s.token_ids for s in a.samples] == [s.token_ids for s in b.samples]
    assert a.samples[0].token_ids != a.samples[1].token_ids


def test_a_prompt_with_its_own_seed_gets_the_same_samples_in_any_request(unified):
    """What makes rollout results independent of the engine count: the driver seeds each prompt
    from its global index, and vLLM samples it the same alone or beside other prompts."""
    _, _, engine = unified
    prompts = [Prompt(prompt_id=str(i), token_ids=p, seed=1000 + i) for i, p in enumerate(PROMPTS)]
    sampling = SamplingParams(n=2, temperature=1.0, max_tokens=8)

    def run(chosen):
        result = engine.generate(RolloutRequest(request_id="s", prompts=chosen, sampling=sampling))
        return {(s.prompt_id, s.sample_index): s.token_ids for s in result.samples}

    together = run(prompts)
    assert together == {**run(prompts[1:]), **run(prompts[:1])}


@pytest.mark.parametrize("field,value", [("top_k", 5), ("top_p", 0.9)])
def test_top_k_and_top_p_are_refused_with_the_logprob_reason(unified, field, value):
    _, _, engine = unified
    request = _request(1.0)
    request.sampling = request.sampling.model_copy(update={field: value})
    with pytest.raises(ValueError, match="full-vocabulary softmax"):
        engine.generate(request)


def test_a_prompt_longer_than_the_model_allows_is_refused(unified):
    job, _, engine = unified
    request = RolloutRequest(
        request_id="long",
        prompts=[Prompt(prompt_id="x", token_ids=[1] * job.model.max_model_len)],
        sampling=SamplingParams(max_tokens=4),
    )
    with pytest.raises(ValueError, match="max_model_len"):
        engine.generate(request)
