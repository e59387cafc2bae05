"""Held-out evaluation inside a run: the rollout engines generate, a reward pool per set scores.

``services.evaluation.evaluate`` does the counting (pass@1, mean@n); this module binds it to the
run's engines, tokenizer and reward pools (one per distinct reward set, created on first use).
"""

from __future__ import annotations

from typing import Any

from fp8rl.protocol import JobSpec, SamplingParams
from fp8rl.services.data import build_dataset, dataset_name, render_prompt
from fp8rl.services.evaluation import evaluate
from fp8rl.services.reward_pool import RewardPool
from fp8rl.services.rollout_phase import generate


class Evaluator:
    """Evaluates the current policy on ``job.eval.datasets`` with the rollout engines."""

    def __init__(self, job: JobSpec, tokenizer: Any) -> None:
        self.job, self.tokenizer = job, tokenizer
        self.sets = []
        for spec in job.eval.datasets:
            records = build_dataset(spec)[: job.eval.limit]
            self.sets.append((dataset_name(spec), records))
        self.rewards: dict[str, RewardPool] = {}

    def close(self) -> None:
        """Stop the evaluation reward pools' in-process verifier children."""
        for pool in self.rewards.values():
            pool.close()

    def due(self, step: int) -> bool:
        """Whether to evaluate after ``step`` (every N steps and after the last one)."""
        n = self.job.eval.every_n_steps
        return bool(self.sets) and n > 0 and ((step + 1) % n == 0 or step + 1 == self.job.steps)

    def _reward(self, name: str, train_reward: RewardPool) -> RewardPool:
        terms = self.job.eval.rewards.get(name)
        if terms is None:
            return train_reward
        if name not in self.rewards:
            spec = self.job.reward.model_copy(update={"functions": terms, "remote": None})
            self.rewards[name] = RewardPool(spec)
        return self.rewards[name]

    def run(
        self, step: int, engines: list[Any], train_reward: RewardPool
    ) -> tuple[dict[str, float], list[dict[str, Any]]]:
        """``val/<name>/*`` metrics of every evaluation set, and sample rows for a table."""
        ev = self.job.eval
        sampling = SamplingParams(
            n=ev.n,
            temperature=ev.temperature,
            max_tokens=ev.max_tokens,
            seed=self.job.seed + 7919 * (step + 1),
        )
        metrics: dict[str, float] = {}
        rows: list[dict[str, Any]] = []
        data = self.job.data
        for name, records in self.sets:

            def render(record, data=data):
                return render_prompt(
                    record,
                    tokenizer=self.tokenizer,
                    template=data.prompt_template,
                    system_prompt=data.system_prompt,
                    chat_template=self.job.model.chat_template,
                )

            def gen(prompts, params, name=name, records=records):
                samples = generate(
                    engines,
                    [(f"p{i}", ids) for i, ids in enumerate(prompts)],
                    params,
                    request_id=f"eval{step}/{name}",
                )
                if not any(r["dataset"] == name for r in rows):
                    rows.extend(
                        {
                            "dataset": name,
                            "prompt": rec.question,
                            "answer": rec.answer,
                            "response": self.tokenizer.decode(
                                s.token_ids, skip_special_tokens=True
                            ),
                        }
                        for rec, s in zip(records, samples[:: params.n], strict=False)
                    )
                return samples

            metrics.update(
                evaluate(
                    gen,
                    records,
                    name=name,
                    reward=self._reward(name, train_reward),
                    render=render,
                    decode=lambda ids: self.tokenizer.decode(ids, skip_special_tokens=True),
                    sampling=sampling,
                    n=ev.n,
                )
            )
        return metrics, rows
