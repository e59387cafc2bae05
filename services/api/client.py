"""A small HTTP client of the REST API (used by ``fp8rl runs …``; handy in notebooks).

Errors come back as ``ApiError`` carrying the server's problem details, so the CLI prints the
server's words (``rollout.max_tokns: unknown field — did you mean max_tokens?``) rather than a
traceback. ``events`` follows the SSE stream and reconnects with ``Last-Event-ID`` when the
connection drops, until the run reaches a terminal state.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx

from fp8rl.protocol import RunState

API_PREFIX = "/api/v1"


class ApiError(RuntimeError):
    """An error response (``status``, ``problem``: the RFC 9457 body) or an unreachable server."""

    def __init__(self, status: int | None, message: str, problem: dict[str, Any] | None = None):
        super().__init__(message)
        self.status = status
        self.problem = problem or {}


@dataclass(frozen=True)
class Event:
    """One server-sent event: ``event`` (``step``/``state``), ``id`` (step events) and JSON ``data``."""

    event: str
    id: str | None
    data: dict[str, Any]


def parse_sse(lines: Iterator[str]) -> Iterator[Event]:
    """Events from the lines of a ``text/event-stream`` (comments and ``retry`` skipped)."""
    event, event_id, data = "message", None, []
    for line in lines:
        if line == "":
            if data:
                yield Event(event, event_id, json.loads("\n".join(data)))
            event, event_id, data = "message", None, []
            continue
        if line.startswith(":"):
            continue
        field, _, value = line.partition(":")
        value = value[1:] if value.startswith(" ") else value
        if field == "event":
            event = value
        elif field == "data":
            data.append(value)
        elif field == "id":
            event_id = value


class ApiClient:
    """Client of one fp8rl API server.

    Args:
        url: base URL, e.g. ``http://127.0.0.1:8000``.
        token: the bearer token.
        timeout_s: per-request timeout (event streams wait without limit between events).
    """

    def __init__(self, url: str, token: str, *, timeout_s: float = 30.0) -> None:
        self.url = url.rstrip("/")
        self._http = httpx.Client(
            base_url=self.url,
            headers={"Authorization": f"Bearer {token}"},
            timeout=timeout_s,
        )

    def close(self) -> None:
        """Close the connection pool."""
        self._http.close()

    def __enter__(self) -> ApiClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        try:
            response = self._http.request(method, API_PREFIX + path, **kwargs)
        except httpx.HTTPError as exc:
            raise ApiError(None, f"cannot reach the fp8rl API at {self.url}: {exc}") from None
        _raise_for_problem(response)
        return response

    def create_run(
        self,
        spec: dict[str, Any] | str,
        *,
        overrides: list[str] | None = None,
        idempotency_key: str | None = None,
    ) -> dict[str, Any]:
        """POST /runs with a JobSpec mapping or YAML text; returns the new run."""
        headers = {"Idempotency-Key": idempotency_key} if idempotency_key else {}
        params = {"override": overrides or []}
        if isinstance(spec, str):
            headers["Content-Type"] = "application/yaml"
            return self._request(
                "POST", "/runs", content=spec.encode(), headers=headers, params=params
            ).json()
        return self._request("POST", "/runs", json=spec, headers=headers, params=params).json()

    def list_runs(
        self, *, state: RunState | str | None = None, limit: int = 50, offset: int = 0
    ) -> dict[str, Any]:
        """GET /runs (one page)."""
        params: dict[str, Any] = {"limit": limit, "offset": offset}
        if state:
            params["state"] = str(state)
        return self._request("GET", "/runs", params=params).json()

    def get_run(self, run_id: str) -> dict[str, Any]:
        """GET /runs/{id}."""
        return self._request("GET", f"/runs/{run_id}").json()

    def metrics(self, run_id: str, *, since: int | None = None) -> list[dict[str, Any]]:
        """GET /runs/{id}/metrics (steps after ``since``)."""
        params = {} if since is None else {"since": since}
        return self._request("GET", f"/runs/{run_id}/metrics", params=params).json()["metrics"]

    def logs(self, run_id: str, *, tail: int = 200, source: str = "driver") -> list[str]:
        """GET /runs/{id}/logs."""
        params = {"tail": tail, "source": source}
        return self._request("GET", f"/runs/{run_id}/logs", params=params).json()["lines"]

    def stop_run(self, run_id: str) -> dict[str, Any]:
        """POST /runs/{id}/stop."""
        return self._request("POST", f"/runs/{run_id}/stop").json()

    def delete_run(self, run_id: str) -> None:
        """DELETE /runs/{id}."""
        self._request("DELETE", f"/runs/{run_id}")

    def events(
        self, run_id: str, *, last_event_id: str | None = None, max_reconnects: int = 20
    ) -> Iterator[Event]:
        """Follow GET /runs/{id}/events until a terminal ``state`` event, reconnecting with
        ``Last-Event-ID`` after dropped connections (at most ``max_reconnects`` in a row)."""
        failures = 0
        limits = self._http.timeout
        while True:
            headers = {"Last-Event-ID": last_event_id} if last_event_id else {}
            try:
                with self._http.stream(
                    "GET",
                    f"{API_PREFIX}/runs/{run_id}/events",
                    headers=headers,
                    # (connect, read, write, pool) with no read limit: a plain tuple, which
                    # both httpx and httpx2 (starlette's TestClient) clients accept.
                    timeout=(limits.connect, None, limits.write, limits.pool),
                ) as response:
                    if response.status_code >= 400:
                        response.read()
                        _raise_for_problem(response)
                    for event in parse_sse(response.iter_lines()):
                        failures = 0
                        if event.id is not None:
                            last_event_id = event.id
                        yield event
                        if event.event == "state" and _is_terminal(event.data.get("state")):
                            return
            except httpx.TransportError as exc:
                failures += 1
                if failures > max_reconnects:
                    raise ApiError(None, f"event stream of {run_id} lost: {exc}") from None
                time.sleep(min(2.0, 0.2 * failures))
                continue
            # the server closed the stream without a terminal state (deleted run, restart)
            failures += 1
            if failures > max_reconnects:
                raise ApiError(None, f"event stream of {run_id} ended without a final state")
            time.sleep(min(2.0, 0.2 * failures))


def _is_terminal(state: Any) -> bool:
    try:
        return RunState(state).terminal
    except ValueError:
        return state is None  # a deleted run


def _raise_for_problem(response: httpx.Response) -> None:
    if response.status_code < 400:
        return
    try:
        problem = response.json()
    except ValueError:
        problem = {}
    if not isinstance(problem, dict):
        problem = {}
    message = problem.get("detail") or problem.get("title") or response.reason_phrase
    raise ApiError(response.status_code, f"{response.status_code}: {message}", problem)
