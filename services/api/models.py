"""Response bodies of the REST API (pydantic; they generate the OpenAPI schema).

Times are ISO 8601 in UTC. A metric value of ``null`` means the driver reported NaN or ±inf.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel, Field

from fp8rl.protocol import RunState
from fp8rl.services.store import MetricRow, RunRecord


class Metrics(BaseModel):
    """Metrics of one RL step."""

    step: int = Field(ge=0)
    time: datetime
    values: dict[str, float | None]

    @classmethod
    def of(cls, row: MetricRow) -> Metrics:
        """From a store row."""
        return cls(step=row.step, time=row.time, values=row.values)


class RunSummary(BaseModel):
    """A run as listed by ``GET /runs``."""

    id: str
    name: str
    state: RunState
    current_step: int | None = Field(description="Last step the driver reported (null: none yet).")
    total_steps: int
    stop_requested: bool
    error: str | None
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None

    @classmethod
    def of(cls, run: RunRecord) -> RunSummary:
        """From a store record."""
        return cls(**{name: getattr(run, name) for name in cls.model_fields})


class RunDetail(RunSummary):
    """A run with its resolved spec, quant fingerprint and latest metrics."""

    spec: dict[str, Any] = Field(description="The resolved JobSpec the driver runs.")
    quant_fingerprint: str | None
    run_dir: str = Field(description="Server-side run directory (chosen by the service).")
    ray_job_id: str = Field(description="Submission id of the Ray job running the driver.")
    latest_metrics: Metrics | None

    @classmethod
    def of_run(cls, run: RunRecord, latest: MetricRow | None) -> RunDetail:
        """From a store record and its latest metrics row."""
        fields = {name: getattr(run, name) for name in cls.model_fields if name != "latest_metrics"}
        return cls(**fields, latest_metrics=Metrics.of(latest) if latest else None)


class RunList(BaseModel):
    """One page of runs, newest first."""

    runs: list[RunSummary]
    total: int = Field(description="Runs matching the filter, all pages.")
    next_offset: int | None = Field(description="Offset of the next page (null: last page).")


class MetricsList(BaseModel):
    """Metric rows in step order."""

    run_id: str
    metrics: list[Metrics]


class LogTail(BaseModel):
    """The last lines of a run's log."""

    run_id: str
    source: str = Field(
        description="`driver`: lines the driver reported; `ray`: the job's stdout/stderr."
    )
    lines: list[str]


class Health(BaseModel):
    """Liveness: the process answers and the store is reachable."""

    status: str
    store: str
    ray_address: str
    ray_reachable: bool | None = Field(
        description="Whether the last reconciliation reached Ray (null: not tried yet)."
    )


class Version(BaseModel):
    """Versions of the service and what it talks to."""

    fp8rl: str
    api: str
    ray: str | None
    store_schema: str
