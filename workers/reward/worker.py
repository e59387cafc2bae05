"""RewardWorker: scores decoded responses with the terms of a ``RewardSpec``.

A plain class (the driver wraps it with ``ray.remote(RewardWorker)``), built from its own
sub-spec only. Rule-based terms run inline; ``math`` runs math-verify in child processes with
an outer timeout (signals do not work off the main thread, where Ray runs actor methods); the
remote reward model is called over HTTP. Truncated responses (``finish_reason == "length"``)
follow ``RewardSpec.truncated``: scored as is, 0, or ``truncated_penalty`` (then no term is
computed for them).
"""

from __future__ import annotations

from fp8rl.protocol.reward_messages import RewardInput, RewardOutput
from fp8rl.protocol.reward_spec import RewardSpec
from fp8rl.workers.reward.functions import resolve_reward_fn
from fp8rl.workers.reward.remote import RemoteRewardClient
from fp8rl.workers.reward.subprocess_pool import SubprocessPool

MATH_TARGET = "fp8rl.workers.reward.functions:math_verify_score"
"""What the verifier children run for the ``math`` reward."""


class RewardWorker:
    """Scores ``RewardInput``s into ``RewardOutput``s (same order) for one ``RewardSpec``.

    Raises ``ValueError`` at construction when a function name cannot be resolved. Counters
    ``num_timeouts`` and ``num_errors`` accumulate over the worker's life (see ``stats()``).
    """

    def __init__(self, spec: RewardSpec) -> None:
        self.spec = spec
        self._fns = {term.name: resolve_reward_fn(term.name) for term in spec.functions}
        self._pool: SubprocessPool | None = None
        self._remote = RemoteRewardClient(spec.remote) if spec.remote is not None else None
        self.num_timeouts = 0
        self.num_errors = 0

    def score(self, items: list[RewardInput]) -> list[RewardOutput]:
        """Total reward and per-term values for each item; see the module doc for truncation."""
        truncated = [item.finish_reason == "length" for item in items]
        skip = [t and self.spec.truncated != "score" for t in truncated]
        todo = [item for item, s in zip(items, skip, strict=True) if not s]
        terms: list[dict[str, float]] = [{} for _ in todo]
        timed_out = [False] * len(todo)

        for term in self.spec.functions:
            values, outs = self._run_term(term.name, term.kwargs, todo)
            for index, (value, out) in enumerate(zip(values, outs, strict=True)):
                terms[index][term.name] = value
                timed_out[index] |= out
        if self._remote is not None and todo:
            for index, remote in enumerate(self._remote.score(todo)):
                terms[index]["remote"] = remote.reward
                timed_out[index] |= remote.timed_out
                self.num_timeouts += remote.timed_out

        weights = {term.name: term.weight for term in self.spec.functions}
        if self.spec.remote is not None:
            weights["remote"] = self.spec.remote.weight
        outputs, scored = [], iter(zip(terms, timed_out, strict=True))
        for was_truncated, skipped in zip(truncated, skip, strict=True):
            if skipped:
                value = 0.0 if self.spec.truncated == "zero" else self.spec.truncated_penalty
                outputs.append(RewardOutput(reward=value, truncated=True))
                continue
            item_terms, item_timed_out = next(scored)
            total = sum(weights[name] * value for name, value in item_terms.items())
            outputs.append(
                RewardOutput(
                    reward=total,
                    terms=item_terms,
                    truncated=was_truncated,
                    timed_out=item_timed_out,
                )
            )
        return outputs

    def _run_term(
        self, name: str, kwargs: dict, items: list[RewardInput]
    ) -> tuple[list[float], list[bool]]:
        if name != "math":
            fn = self._fns[name]
            values = [
                float(fn(prompt=item.prompt, response=item.response, answer=item.answer, **kwargs))
                for item in items
            ]
            return values, [False] * len(items)
        if self._pool is None:
            self._pool = SubprocessPool(
                MATH_TARGET,
                num_processes=self.spec.verifier_processes,
                timeout_s=self.spec.timeout_s,
            )
        results = self._pool.map(
            [{"response": item.response, "answer": item.answer} for item in items]
        )
        self.num_timeouts += sum(r.timed_out for r in results)
        self.num_errors += sum(r.error is not None for r in results)
        return [r.value for r in results], [r.timed_out for r in results]

    def stats(self) -> dict[str, float]:
        """``reward/verifier_timeouts`` and ``reward/verifier_errors`` so far (counts)."""
        return {
            "reward/verifier_timeouts": float(self.num_timeouts),
            "reward/verifier_errors": float(self.num_errors),
        }

    def close(self) -> None:
        """Stop the verifier children and the HTTP client."""
        if self._pool is not None:
            self._pool.close()
            self._pool = None
        if self._remote is not None:
            self._remote.close()
