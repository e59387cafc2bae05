"""The run store: SQLite/PostgreSQL tables of runs, per-step metrics and logs, and the driver's
reporter. Used by the REST API (``fp8rl.services.api``) and, through ``reporter_from_env``, by
the driver inside a Ray job. Imports SQLAlchemy and Alembic, never torch or ray.
"""

from fp8rl.services.store.reporter import RunReporter, reporter_from_env
from fp8rl.services.store.runs import IdempotencyClaim, MetricRow, RunRecord, RunStore

__all__ = [
    "IdempotencyClaim",
    "MetricRow",
    "RunRecord",
    "RunReporter",
    "RunStore",
    "reporter_from_env",
]
