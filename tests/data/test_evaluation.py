"""evaluate() with a fake engine returning canned responses."""

from __future__ import annotations

import pytest

from fp8rl.protocol import RewardSpec, RolloutSample, SamplingParams
from fp8rl.services.data import PromptRecord
from fp8rl.services.evaluation import evaluate
from fp8rl.workers.reward import RewardWorker

RECORDS = [PromptRecord(prompt_id=f"p{i}", question=f"q{i}", answer=str(i)) for i in range(4)]
# canned answers per problem (n = 3): first sample, then two more; "x" = wrong
CANNED = {0: ["0", "0", "x"], 1: ["x", "1", "x"], 2: ["2", "2", "2"], 3: ["x", "x", "x"]}


def fake_generate(prompts: list[list[int]], params: SamplingParams) -> list[RolloutSample]:
    samples = []
    for ids in prompts:
        problem = ids[0]
        for k in range(params.n):
            text = CANNED[problem][k]
            tokens = [ord(c) for c in text]
            samples.append(
                RolloutSample(
                    prompt_id=f"p{problem}", sample_index=k, prompt_token_ids=ids, token_ids=tokens,
                    logprobs=[0.0] * len(tokens), finish_reason="length" if problem == 3 else "stop",
                    policy_version=0, quant_fingerprint=None,
                )
            )  # fmt: skip
    return samples


def run(n: int, batch_size: int | None = None, generate=fake_generate) -> dict[str, float]:
    return evaluate(
        generate, RECORDS, name="toy", reward=RewardWorker(RewardSpec(functions=[{"name": "arithmetic"}])),
        render=lambda record: [int(record.prompt_id[1:])], decode=lambda ids: "".join(map(chr, ids)),
        sampling=SamplingParams(temperature=0.0, max_tokens=8), n=n, batch_size=batch_size,
    )  # fmt: skip


def test_pass_at_1_mean_at_k_and_pass_at_k_by_hand():
    metrics = run(n=3, batch_size=3)
    # first samples correct: p0, p2 -> acc 2/4; per-problem means 2/3, 1/3, 1, 0 -> mean@3 = 0.5;
    # any correct: p0, p1, p2 -> pass@3 = 3/4; p3's three samples were truncated -> clip 3/12
    assert metrics["val/toy/acc"] == pytest.approx(0.5)
    assert metrics["val/toy/mean@3"] == pytest.approx(0.5)
    assert metrics["val/toy/pass@3"] == pytest.approx(0.75)
    assert metrics["val/toy/clip_ratio"] == pytest.approx(0.25)
    assert metrics["val/toy/response_length/mean"] == pytest.approx(1.0)
    assert metrics["val/toy/num_problems"] == 4.0


def test_single_sample_accuracy_equals_mean():
    metrics = run(n=1)
    assert metrics["val/toy/acc"] == metrics["val/toy/mean@1"] == pytest.approx(0.5)


def test_wrong_sample_count_from_engine_is_refused():
    with pytest.raises(ValueError, match="expected n samples per prompt"):
        run(n=2, generate=lambda prompts, params: fake_generate(prompts, params)[:-1])
