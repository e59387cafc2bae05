"""Server-sent events of a run: one ``step`` event per reported step, ``state`` on changes.

Wire format (``text/event-stream``)::

    retry: 2000

    event: state
    data: {"state": "RUNNING", "current_step": null, "error": null}

    event: step
    id: 1
    data: {"step": 1, "time": "2026-…Z", "metrics": {"reward/mean": 0.5, …}}

The ``id`` of a step event is its step number, so a client that reconnects with
``Last-Event-ID: 7`` receives steps 8… and nothing twice. ``state`` events carry no id (they
never move the resume point) and are sent at the start of every stream and on every change; the
stream ends after the terminal state event, which comes after every step row (the state is read
before the rows of each poll). Clients should stop reconnecting once they have seen a terminal
state. The store is polled (the driver writes from another process; no pub/sub is needed for
SQLite and PostgreSQL alike); a ``: ping`` comment every 15 s keeps proxies from closing idle
streams.
"""

from __future__ import annotations

import functools
import json
import time
from collections.abc import AsyncIterator

import anyio

from fp8rl.services.store import RunStore

RETRY_MS = 2000
PING_EVERY_S = 15.0


def _event(event: str, data: dict, event_id: str | None = None) -> bytes:
    """One event in the SSE wire format (the JSON has no newlines, so one ``data:`` line)."""
    lines = [f"event: {event}", f"data: {json.dumps(data, separators=(',', ':'))}"]
    if event_id is not None:
        lines.append(f"id: {event_id}")
    return ("\n".join(lines) + "\n\n").encode()


async def run_events(
    store: RunStore, run_id: str, *, after: int | None, poll_s: float
) -> AsyncIterator[bytes]:
    """The event stream of ``run_id`` starting after step ``after`` (None: from the start)."""
    yield f"retry: {RETRY_MS}\n\n".encode()
    last_state = None
    last_sent = time.monotonic()
    while True:
        run = await anyio.to_thread.run_sync(store.get_run, run_id)
        if run is None:
            yield _event("state", {"state": None, "deleted": True})
            return
        rows = await anyio.to_thread.run_sync(functools.partial(store.metrics, run_id, after=after))
        sent = bool(rows)
        for row in rows:
            payload = {"step": row.step, "time": row.time.isoformat(), "metrics": row.values}
            yield _event("step", payload, str(row.step))
            after = row.step
        if run.state != last_state:
            last_state = run.state
            payload = {
                "state": run.state.value,
                "current_step": run.current_step,
                "error": run.error,
            }
            yield _event("state", payload)
            sent = True
        if sent:
            last_sent = time.monotonic()
        if run.state.terminal:
            return
        if time.monotonic() - last_sent > PING_EVERY_S:
            yield b": ping\n\n"
            last_sent = time.monotonic()
        await anyio.sleep(poll_s)
