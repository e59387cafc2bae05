"""Tables of the run store (SQLAlchemy Core; the Alembic migrations create exactly these).

Four tables: ``runs`` (one row per run, its state and the resolved spec), ``metrics`` (one row per
reported step, values as a JSON object), ``run_logs`` (lines the driver reported) and
``idempotency_keys`` (stored responses of ``POST /runs``). Core tables rather than ORM classes: the
store is a handful of explicit statements and the rows travel out as frozen dataclasses.

A change here needs a new migration in ``migrations/versions``; a test compares the migrated
schema with this metadata and fails on any difference.
"""

from __future__ import annotations

from sqlalchemy import (
    JSON,
    Boolean,
    Column,
    DateTime,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    UniqueConstraint,
)

metadata = MetaData(
    naming_convention={
        "ix": "ix_%(column_0_label)s",
        "uq": "uq_%(table_name)s_%(column_0_name)s",
        "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
        "pk": "pk_%(table_name)s",
    }
)

runs = Table(
    "runs",
    metadata,
    Column("id", String(100), primary_key=True),
    Column("name", String(64), nullable=False),
    Column("state", String(16), nullable=False, index=True),
    Column("spec", JSON, nullable=False),
    Column("total_steps", Integer, nullable=False),
    Column("quant_fingerprint", String(64)),
    Column("run_dir", Text, nullable=False),
    Column("ray_job_id", String(128), nullable=False),
    Column("current_step", Integer),
    Column("error", Text),
    Column("stop_requested", Boolean, nullable=False, default=False),
    Column("stop_requested_at", DateTime(timezone=True)),
    Column("created_at", DateTime(timezone=True), nullable=False, index=True),
    Column("started_at", DateTime(timezone=True)),
    Column("finished_at", DateTime(timezone=True)),
    Column("updated_at", DateTime(timezone=True), nullable=False),
)

metrics = Table(
    "metrics",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("run_id", String(100), ForeignKey("runs.id", ondelete="CASCADE"), nullable=False),
    Column("step", Integer, nullable=False),
    Column("time", DateTime(timezone=True), nullable=False),
    Column("values", JSON, nullable=False),
    UniqueConstraint("run_id", "step", name="uq_metrics_run_id_step"),
)

run_logs = Table(
    "run_logs",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("run_id", String(100), ForeignKey("runs.id", ondelete="CASCADE"), nullable=False),
    Column("time", DateTime(timezone=True), nullable=False),
    Column("line", Text, nullable=False),
    Index("ix_run_logs_run_id_id", "run_id", "id"),
)

idempotency_keys = Table(
    "idempotency_keys",
    metadata,
    Column("key", String(255), primary_key=True),
    Column("request_hash", String(64), nullable=False),
    Column("status_code", Integer),
    Column("response", JSON),
    Column("created_at", DateTime(timezone=True), nullable=False, index=True),
)
