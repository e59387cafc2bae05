"""RewardWorker: scores decoded responses with the terms of a ``RewardSpec``.

A plain class (the driver wraps it with ``ray.remote(RewardWorker)``), built from its own
sub-spec only. Built-in rule terms run inline (linear-time; user patterns on RE2); ``math``
runs math-verify and custom functions run user code in child processes with an outer timeout
(signals do not work off the main thread, where Ray runs actor methods; a hung child is killed);
the remote reward model is called over HTTP with its own timeout. A term that times out or raises
scores ``failure_reward``; more than ``max_failure_fraction`` of a batch failing raises
``RewardFailure`` (the run fails with that reason). Truncated responses (``finish_reason == "length"``)
follow ``RewardSpec.truncated``: scored as is, 0, or ``truncated_penalty`` (then no term is
computed for them).
"""

from __future__ import annotations

from fp8rl.protocol.reward_messages import RewardInput, RewardOutput
from fp8rl.protocol.reward_spec import RewardSpec
from fp8rl.workers.reward.functions import resolve_reward_fn
from fp8rl.workers.reward.isolated import custom_pool, is_custom, regex_problems
from fp8rl.workers.reward.remote import RemoteRewardClient
from fp8rl.workers.reward.subprocess_pool import CallResult, SubprocessPool

MATH_TARGET = "fp8rl.workers.reward.functions:math_verify_score"
"""What the verifier children run for the ``math`` reward."""


class RewardFailure(RuntimeError):
    """Too many responses of one batch could not be scored (timeouts or errors)."""


class RewardWorker:
    """Scores ``RewardInput``s into ``RewardOutput``s (same order) for one ``RewardSpec``.

    Raises ``ValueError`` at construction when a function name cannot be resolved or a user
    pattern is not RE2. Counters ``num_timeouts`` and ``num_errors`` accumulate over the worker's
    life (see ``stats()``); ``score`` raises ``RewardFailure`` (see the module doc).
    """

    def __init__(self, spec: RewardSpec) -> None:
        self.spec = spec
        problems = regex_problems(spec.functions)
        if problems:
            raise ValueError("; ".join(problems))
        self._fns = {term.name: resolve_reward_fn(term.name) for term in spec.functions}
        self._pools: dict[str, SubprocessPool] = {}
        self._first_error: str | None = None
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
        failed = [False] * len(todo)

        for term in self.spec.functions:
            results = self._run_term(term.name, term.kwargs, todo)
            for index, result in enumerate(results):
                bad = result.timed_out or result.error is not None
                terms[index][term.name] = self.spec.failure_reward if bad else result.value
                timed_out[index] |= result.timed_out
                failed[index] |= bad
        if self._remote is not None and todo:
            for index, remote in enumerate(self._remote.score(todo)):
                terms[index]["remote"] = (
                    self.spec.failure_reward if remote.timed_out else remote.reward
                )
                timed_out[index] |= remote.timed_out
                failed[index] |= remote.timed_out
                self.num_timeouts += remote.timed_out
        self._check_failures(failed)

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

    def _run_term(self, name: str, kwargs: dict, items: list[RewardInput]) -> list[CallResult]:
        """One term over ``items``: inline for built-ins, in bounded child processes otherwise."""
        if name == "math":
            payloads = [{"response": item.response, "answer": item.answer} for item in items]
        elif is_custom(name):
            payloads = [
                {"prompt": item.prompt, "response": item.response, "answer": item.answer, **kwargs}
                for item in items
            ]
        else:
            fn = self._fns[name]
            return [
                CallResult(
                    float(fn(prompt=i.prompt, response=i.response, answer=i.answer, **kwargs))
                )
                for i in items
            ]
        results = self._pool(name).map(payloads)
        self.num_timeouts += sum(r.timed_out for r in results)
        self.num_errors += sum(r.error is not None for r in results)
        if self._first_error is None:
            self._first_error = next((r.error for r in results if r.error is not None), None)
        return results

    def _pool(self, name: str) -> SubprocessPool:
        if name not in self._pools:
            self._pools[name] = (
                SubprocessPool(
                    MATH_TARGET,
                    num_processes=self.spec.verifier_processes,
                    timeout_s=self.spec.timeout_s,
                )
                if name == "math"
                else custom_pool(name, self.spec)
            )
        return self._pools[name]

    def _check_failures(self, failed: list[bool]) -> None:
        """Raise ``RewardFailure`` when more than ``max_failure_fraction`` of ``failed`` is set."""
        if not failed:
            return
        fraction = sum(failed) / len(failed)
        if fraction > self.spec.max_failure_fraction:
            cause = f"; first error: {self._first_error}" if self._first_error else ""
            raise RewardFailure(
                f"{sum(failed)} of {len(failed)} responses could not be scored (timeouts after "
                f"reward.timeout_s={self.spec.timeout_s:g} s or errors), more than "
                f"reward.max_failure_fraction={self.spec.max_failure_fraction:g}{cause}"
            )

    def stats(self) -> dict[str, float]:
        """``reward/verifier_timeouts`` and ``reward/verifier_errors`` so far (counts)."""
        return {
            "reward/verifier_timeouts": float(self.num_timeouts),
            "reward/verifier_errors": float(self.num_errors),
        }

    def close(self) -> None:
        """Stop the verifier children and the HTTP client."""
        for pool in self._pools.values():
            pool.close()
        self._pools = {}
        if self._remote is not None:
            self._remote.close()
