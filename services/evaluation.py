"""Held-out evaluation: generate ``n`` samples per problem, score them, report pass@1 and mean@n.

The engine and the tokenizer are injected as plain callables (``generate``, ``render``,
``decode``), so the same function evaluates with the native engine, vLLM or a fake in tests, and
it never touches Ray itself. Metric names follow verl/NeMo RL: ``val/<dataset>/acc`` is pass@1
(the first sample of each problem, greedy by default in ``EvalSpec``), ``val/<dataset>/mean@n``
averages all n samples, ``val/<dataset>/pass@n`` takes the best of the n (for 0/1 rewards these
are accuracies; for shaped rewards, mean rewards).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from fp8rl.protocol.messages import RolloutSample, SamplingParams
from fp8rl.protocol.reward_messages import RewardInput
from fp8rl.services.data.records import PromptRecord

GenerateFn = Callable[[list[list[int]], SamplingParams], list[RolloutSample]]
"""Prompt token-id lists + sampling -> ``n`` samples per prompt, grouped by prompt in order."""


def evaluate(
    generate: GenerateFn,
    records: Sequence[PromptRecord],
    *,
    name: str,
    reward: Any,
    render: Callable[[PromptRecord], list[int]],
    decode: Callable[[list[int]], str],
    sampling: SamplingParams,
    n: int,
    batch_size: int | None = None,
) -> dict[str, float]:
    """Evaluate ``records`` and return ``val/<name>/...`` metrics (floats).

    ``reward``: a ``RewardWorker`` (anything with ``score(list[RewardInput]) -> list[RewardOutput]``);
    ``render``: record -> prompt token ids (``render_prompt`` with the tokenizer bound);
    ``decode``: response token ids -> text; ``sampling``: evaluation sampling (its ``n`` is
    replaced by ``n``); ``batch_size``: prompts per ``generate`` call (None: all at once).
    Metrics: ``acc`` (pass@1), ``mean@{n}``, ``pass@{n}``, ``response_length/mean`` (tokens),
    ``clip_ratio`` (fraction cut at max_tokens), ``num_problems``. Raises ``ValueError`` when
    ``records`` is empty, ``n < 1``, or ``generate`` returns a different number of samples than
    ``n`` per prompt.
    """
    if not records:
        raise ValueError(f"evaluation set {name!r} has no problems")
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    params = sampling.model_copy(update={"n": n})
    step = batch_size or len(records)
    rewards: list[list[float]] = []
    lengths: list[int] = []
    truncated = 0
    for start in range(0, len(records), step):
        chunk = list(records[start : start + step])
        samples = generate([render(record) for record in chunk], params)
        if len(samples) != len(chunk) * n:
            raise ValueError(
                f"generate returned {len(samples)} samples for {len(chunk)} prompts × n={n}; "
                "expected n samples per prompt, grouped by prompt"
            )
        inputs = [
            RewardInput(
                prompt_id=record.prompt_id,
                prompt=record.question,
                response=decode(sample.token_ids),
                answer=record.answer,
                finish_reason=sample.finish_reason,
                num_tokens=len(sample.token_ids),
                max_tokens=params.max_tokens,
            )
            for index, sample in enumerate(samples)
            for record in [chunk[index // n]]
        ]
        outputs = reward.score(inputs)
        for i in range(len(chunk)):
            rewards.append([out.reward for out in outputs[i * n : (i + 1) * n]])
        lengths.extend(len(sample.token_ids) for sample in samples)
        truncated += sum(sample.finish_reason == "length" for sample in samples)

    num = len(rewards)
    prefix = f"val/{name}"
    return {
        f"{prefix}/acc": sum(r[0] for r in rewards) / num,
        f"{prefix}/mean@{n}": sum(sum(r) / n for r in rewards) / num,
        f"{prefix}/pass@{n}": sum(max(r) for r in rewards) / num,
        f"{prefix}/response_length/mean": sum(lengths) / len(lengths),
        f"{prefix}/clip_ratio": truncated / len(lengths),
        f"{prefix}/num_problems": float(num),
    }
