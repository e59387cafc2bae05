"""A reward model served over HTTP: POST ``{prompt, response, answer}`` → ``{"reward": float}``.

Timeouts and 5xx answers are retried with exponential backoff (``backoff_s · 2^k``); a request
that still times out scores 0 and is counted (like a math-verify timeout), while a server that
keeps failing (5xx, connection refused) or refuses the request (4xx, bad JSON) raises: training
on zeros from a dead reward model would silently corrupt the run.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import httpx

from fp8rl.protocol.reward_messages import RewardInput
from fp8rl.protocol.reward_spec import RemoteRewardSpec


@dataclass(frozen=True)
class RemoteScore:
    """One remote score: ``reward`` (0.0 when ``timed_out``)."""

    reward: float
    timed_out: bool = False


class RemoteRewardClient:
    """HTTP client for ``RemoteRewardSpec``; ``score(items)`` keeps the input order."""

    def __init__(self, spec: RemoteRewardSpec) -> None:
        self.spec = spec
        self._client = httpx.Client(timeout=spec.timeout_s)
        self._executor = ThreadPoolExecutor(max_workers=spec.max_concurrency)

    def score(self, items: list[RewardInput]) -> list[RemoteScore]:
        """Score every item (concurrently, ``max_concurrency`` at a time).

        Raises ``RuntimeError`` naming the URL when the server answers 4xx, non-JSON or no
        ``reward`` field, or still fails with 5xx/connection errors after ``max_retries``.
        """
        return list(self._executor.map(self._score_one, items))

    def _score_one(self, item: RewardInput) -> RemoteScore:
        payload = {"prompt": item.prompt, "response": item.response, "answer": item.answer}
        url, last_error = self.spec.url, ""
        for attempt in range(self.spec.max_retries + 1):
            if attempt:
                time.sleep(self.spec.backoff_s * 2 ** (attempt - 1))
            try:
                response = self._client.post(url, json=payload)
            except httpx.TimeoutException:
                last_error = "timeout"
                continue
            except httpx.TransportError as error:
                last_error = f"{type(error).__name__}: {error}"
                continue
            if response.status_code >= 500:
                last_error = f"HTTP {response.status_code}"
                continue
            if response.status_code >= 400:
                raise RuntimeError(
                    f"reward model {url} refused the request: HTTP {response.status_code} {response.text[:200]}"
                )
            try:
                return RemoteScore(float(response.json()["reward"]))
            except (ValueError, KeyError, TypeError) as error:
                raise RuntimeError(
                    f'reward model {url} answered {response.text[:200]!r}; expected JSON {{"reward": float}}'
                ) from error
        if last_error == "timeout":
            return RemoteScore(0.0, timed_out=True)
        raise RuntimeError(
            f"reward model {url} failed after {self.spec.max_retries + 1} attempts: {last_error}"
        )

    def close(self) -> None:
        """Close the HTTP connections and the request threads."""
        self._executor.shutdown(wait=True)
        self._client.close()
