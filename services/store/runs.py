"""The run store: runs, their states, metrics, log lines and idempotency records.

Two processes write here: the API service (creates runs, records stop requests, reconciles with
Ray) and the driver (``RunReporter``: RUNNING, one metrics row per step, log lines, the final
state). Every state change is one conditional UPDATE (``... WHERE state IN (PENDING, RUNNING)``),
so terminal states never change whoever writes last, without locks across processes.

Metric values are stored as JSON; non-finite floats (NaN, ±inf) become ``null`` because JSON has
no NaN and PostgreSQL's JSON type rejects it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import Engine, and_, delete, func, insert, select, update
from sqlalchemy.exc import IntegrityError

from fp8rl.protocol import RunState
from fp8rl.services.store.engine import open_engine
from fp8rl.services.store.schema import idempotency_keys, metrics, run_logs, runs

ACTIVE_STATES = (RunState.PENDING.value, RunState.RUNNING.value)
MAX_LOG_LINE_CHARS = 4000
"""Longer log lines are cut (with a marker) so one runaway print cannot bloat the store."""


def utcnow() -> datetime:
    """Timezone-aware now in UTC (all store times are UTC)."""
    return datetime.now(UTC)


def _utc(value: datetime | None) -> datetime | None:
    # SQLite returns naive datetimes; everything written here is UTC.
    if value is None or value.tzinfo is not None:
        return value
    return value.replace(tzinfo=UTC)


@dataclass(frozen=True)
class RunRecord:
    """One run as stored. Times are UTC; ``current_step`` is the last reported step (None: none)."""

    id: str
    name: str
    state: RunState
    spec: dict[str, Any]
    total_steps: int
    quant_fingerprint: str | None
    run_dir: str
    ray_job_id: str
    current_step: int | None
    error: str | None
    stop_requested: bool
    stop_requested_at: datetime | None
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    updated_at: datetime

    @classmethod
    def from_row(cls, row: Any) -> RunRecord:
        """Build from a ``runs`` row."""
        data = dict(row._mapping)
        data["state"] = RunState(data["state"])
        for key in ("stop_requested_at", "created_at", "started_at", "finished_at", "updated_at"):
            data[key] = _utc(data[key])
        data["stop_requested"] = bool(data["stop_requested"])
        return cls(**data)


@dataclass(frozen=True)
class MetricRow:
    """Metrics of one step: ``values`` maps a metric name to a float (None: NaN or ±inf)."""

    step: int
    time: datetime
    values: dict[str, float | None]


@dataclass(frozen=True)
class IdempotencyClaim:
    """Outcome of claiming an Idempotency-Key.

    ``outcome``: ``claimed`` (go ahead, then ``complete_idempotency``), ``replay`` (send back
    ``status_code``/``response``), ``mismatch`` (key used with another request) or ``in_progress``.
    """

    outcome: str
    status_code: int | None = None
    response: Any = None


def clean_metrics(values: Mapping[str, Any]) -> dict[str, float | None]:
    """Metric values as floats, non-finite ones as None.

    Raises:
        ValueError: a name is not a non-empty string or a value is not a real number.
    """
    out: dict[str, float | None] = {}
    for name, value in values.items():
        if not isinstance(name, str) or not name:
            raise ValueError(f"metric names must be non-empty strings, got {name!r}")
        if isinstance(value, bool) or not isinstance(value, int | float):
            try:
                value = float(value)  # numpy and torch scalars
            except (TypeError, ValueError):
                raise ValueError(f"metric {name!r} must be a number, got {value!r}") from None
        value = float(value)
        out[name] = value if math.isfinite(value) else None
    return out


class RunStore:
    """Data access for runs; thread-safe (one engine, a connection per call)."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    @classmethod
    def open(cls, url: str, *, migrate: bool = False) -> RunStore:
        """Open the store at a SQLAlchemy URL (``migrate``: bring the schema to head first)."""
        return cls(open_engine(url, migrate=migrate))

    def close(self) -> None:
        """Release pooled connections."""
        self.engine.dispose()

    # -- runs ---------------------------------------------------------------------------------
    def create_run(
        self,
        *,
        run_id: str,
        name: str,
        spec: dict[str, Any],
        total_steps: int,
        quant_fingerprint: str | None,
        run_dir: str,
        ray_job_id: str,
    ) -> RunRecord:
        """Insert a PENDING run. Raises ``sqlalchemy.exc.IntegrityError`` when the id exists."""
        now = utcnow()
        with self.engine.begin() as conn:
            conn.execute(
                insert(runs).values(
                    id=run_id,
                    name=name,
                    state=RunState.PENDING.value,
                    spec=spec,
                    total_steps=total_steps,
                    quant_fingerprint=quant_fingerprint,
                    run_dir=run_dir,
                    ray_job_id=ray_job_id,
                    stop_requested=False,
                    created_at=now,
                    updated_at=now,
                )
            )
        record = self.get_run(run_id)
        assert record is not None
        return record

    def get_run(self, run_id: str) -> RunRecord | None:
        """The run, or None when unknown."""
        with self.engine.connect() as conn:
            row = conn.execute(select(runs).where(runs.c.id == run_id)).first()
        return RunRecord.from_row(row) if row else None

    def list_runs(
        self, *, state: RunState | None = None, limit: int = 50, offset: int = 0
    ) -> tuple[list[RunRecord], int]:
        """Runs newest first, and the total count matching ``state``."""
        where = runs.c.state == state.value if state else None
        query = select(runs).order_by(runs.c.created_at.desc(), runs.c.id.desc())
        count = select(func.count()).select_from(runs)
        if where is not None:
            query, count = query.where(where), count.where(where)
        with self.engine.connect() as conn:
            rows = conn.execute(query.limit(limit).offset(offset)).all()
            total = conn.execute(count).scalar_one()
        return [RunRecord.from_row(r) for r in rows], int(total)

    def active_runs(self) -> list[RunRecord]:
        """Runs in PENDING or RUNNING, oldest first."""
        with self.engine.connect() as conn:
            rows = conn.execute(
                select(runs).where(runs.c.state.in_(ACTIVE_STATES)).order_by(runs.c.created_at)
            ).all()
        return [RunRecord.from_row(r) for r in rows]

    def mark_running(
        self, run_id: str, *, quant_fingerprint: str | None = None, run_dir: str | None = None
    ) -> bool:
        """PENDING → RUNNING (and record what the driver reports). False when already terminal."""
        now = utcnow()
        values: dict[str, Any] = {"updated_at": now}
        if quant_fingerprint is not None:
            values["quant_fingerprint"] = quant_fingerprint
        if run_dir is not None:
            values["run_dir"] = run_dir
        with self.engine.begin() as conn:
            conn.execute(
                update(runs)
                .where(runs.c.id == run_id, runs.c.state == RunState.PENDING.value)
                .values(state=RunState.RUNNING.value, started_at=now)
            )
            done = conn.execute(
                update(runs)
                .where(runs.c.id == run_id, runs.c.state == RunState.RUNNING.value)
                .values(**values)
            )
        return done.rowcount == 1

    def finish(self, run_id: str, state: RunState, *, error: str | None = None) -> bool:
        """Move an active run to a terminal ``state``; False (no change) when already terminal.

        Raises:
            ValueError: ``state`` is not terminal.
        """
        if not RunState(state).terminal:
            raise ValueError(f"finish: state must be STOPPED, SUCCEEDED or FAILED, got {state}")
        now = utcnow()
        with self.engine.begin() as conn:
            done = conn.execute(
                update(runs)
                .where(runs.c.id == run_id, runs.c.state.in_(ACTIVE_STATES))
                .values(state=RunState(state).value, error=error, finished_at=now, updated_at=now)
            )
        return done.rowcount == 1

    def request_stop(self, run_id: str) -> bool:
        """Record a graceful stop request (first request time kept). False when terminal/unknown."""
        now = utcnow()
        with self.engine.begin() as conn:
            done = conn.execute(
                update(runs)
                .where(runs.c.id == run_id, runs.c.state.in_(ACTIVE_STATES))
                .values(
                    stop_requested=True,
                    stop_requested_at=func.coalesce(runs.c.stop_requested_at, now),
                    updated_at=now,
                )
            )
        return done.rowcount == 1

    def stop_requested(self, run_id: str) -> bool:
        """Whether a stop was requested (the driver polls this between steps)."""
        with self.engine.connect() as conn:
            value = conn.execute(
                select(runs.c.stop_requested).where(runs.c.id == run_id)
            ).scalar_one_or_none()
        return bool(value)

    def delete_run(self, run_id: str) -> bool:
        """Delete a terminal run with its metrics and logs. False when unknown or still active."""
        with self.engine.begin() as conn:
            state = conn.execute(
                select(runs.c.state).where(runs.c.id == run_id)
            ).scalar_one_or_none()
            if state is None or state in ACTIVE_STATES:
                return False
            conn.execute(delete(metrics).where(metrics.c.run_id == run_id))
            conn.execute(delete(run_logs).where(run_logs.c.run_id == run_id))
            conn.execute(delete(runs).where(runs.c.id == run_id))
        return True

    # -- metrics and logs ---------------------------------------------------------------------
    def add_metrics(self, run_id: str, step: int, values: Mapping[str, Any]) -> None:
        """Record the metrics of ``step`` (a re-reported step replaces the earlier row).

        Raises:
            ValueError: negative step or non-numeric values (see ``clean_metrics``).
        """
        if isinstance(step, bool) or not isinstance(step, int) or step < 0:
            raise ValueError(f"step must be a non-negative int, got {step!r}")
        cleaned = clean_metrics(values)
        now = utcnow()
        with self.engine.begin() as conn:
            conn.execute(delete(metrics).where(metrics.c.run_id == run_id, metrics.c.step == step))
            conn.execute(insert(metrics).values(run_id=run_id, step=step, time=now, values=cleaned))
            conn.execute(
                update(runs).where(runs.c.id == run_id).values(current_step=step, updated_at=now)
            )

    def metrics(
        self, run_id: str, *, after: int | None = None, limit: int | None = None
    ) -> list[MetricRow]:
        """Metric rows in step order, only steps greater than ``after`` when given."""
        query = select(metrics).where(metrics.c.run_id == run_id).order_by(metrics.c.step)
        if after is not None:
            query = query.where(metrics.c.step > after)
        if limit is not None:
            query = query.limit(limit)
        with self.engine.connect() as conn:
            rows = conn.execute(query).all()
        return [MetricRow(r.step, _utc(r.time), dict(r.values)) for r in rows]

    def latest_metrics(self, run_id: str) -> MetricRow | None:
        """The row of the highest step, or None."""
        query = (
            select(metrics).where(metrics.c.run_id == run_id).order_by(metrics.c.step.desc())
        ).limit(1)
        with self.engine.connect() as conn:
            row = conn.execute(query).first()
        return MetricRow(row.step, _utc(row.time), dict(row.values)) if row else None

    def add_log(self, run_id: str, line: str) -> None:
        """Append log lines (a multi-line string becomes several lines)."""
        now = utcnow()
        parts = [
            p if len(p) <= MAX_LOG_LINE_CHARS else p[:MAX_LOG_LINE_CHARS] + " …[cut]"
            for p in str(line).splitlines() or [""]
        ]
        with self.engine.begin() as conn:
            conn.execute(
                insert(run_logs), [{"run_id": run_id, "time": now, "line": p} for p in parts]
            )

    def log_tail(self, run_id: str, *, lines: int) -> list[str]:
        """The last ``lines`` log lines, oldest first."""
        query = (
            select(run_logs.c.line)
            .where(run_logs.c.run_id == run_id)
            .order_by(run_logs.c.id.desc())
            .limit(lines)
        )
        with self.engine.connect() as conn:
            found = conn.execute(query).scalars().all()
        return list(reversed(found))

    # -- idempotency --------------------------------------------------------------------------
    def claim_idempotency(
        self, key: str, request_hash: str, *, stale_after: timedelta, keep_for: timedelta
    ) -> IdempotencyClaim:
        """Claim ``key`` for a request whose body hashes to ``request_hash``.

        Completed keys are kept ``keep_for``; an unfinished claim older than ``stale_after`` (its
        request died with the process) can be taken over.
        """
        now = utcnow()
        with self.engine.begin() as conn:
            conn.execute(
                delete(idempotency_keys).where(
                    idempotency_keys.c.created_at < now - keep_for,
                )
            )
            conn.execute(
                delete(idempotency_keys).where(
                    and_(
                        idempotency_keys.c.key == key,
                        idempotency_keys.c.status_code.is_(None),
                        idempotency_keys.c.created_at < now - stale_after,
                    )
                )
            )
        try:
            with self.engine.begin() as conn:
                conn.execute(
                    insert(idempotency_keys).values(
                        key=key, request_hash=request_hash, created_at=now
                    )
                )
            return IdempotencyClaim("claimed")
        except IntegrityError:
            pass
        with self.engine.connect() as conn:
            row = conn.execute(
                select(idempotency_keys).where(idempotency_keys.c.key == key)
            ).first()
        if row is None:  # completed and expired between the two statements: rare, claim again
            return self.claim_idempotency(
                key, request_hash, stale_after=stale_after, keep_for=keep_for
            )
        if row.request_hash != request_hash:
            return IdempotencyClaim("mismatch")
        if row.status_code is None:
            return IdempotencyClaim("in_progress")
        return IdempotencyClaim("replay", row.status_code, row.response)

    def complete_idempotency(self, key: str, *, status_code: int, response: Any) -> None:
        """Store the response sent for ``key`` (replayed for later requests with the same key)."""
        with self.engine.begin() as conn:
            conn.execute(
                update(idempotency_keys)
                .where(idempotency_keys.c.key == key)
                .values(status_code=status_code, response=response)
            )

    def release_unfinished_idempotency(self) -> int:
        """Forget every unfinished claim; returns how many. Called when the server starts: no
        request is in flight then, so such claims belong to a server that died mid-request (a
        retry then finds the run it may have created through the key-derived run id)."""
        with self.engine.begin() as conn:
            result = conn.execute(
                delete(idempotency_keys).where(idempotency_keys.c.status_code.is_(None))
            )
        return result.rowcount or 0

    def release_idempotency(self, key: str) -> None:
        """Forget an unfinished claim (the request failed; the client may retry with the key)."""
        with self.engine.begin() as conn:
            conn.execute(
                delete(idempotency_keys).where(
                    idempotency_keys.c.key == key, idempotency_keys.c.status_code.is_(None)
                )
            )
