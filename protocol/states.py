"""Run states, the same names as Ray Jobs (``ray.job_submission.JobStatus``)."""

from __future__ import annotations

from enum import StrEnum


class RunState(StrEnum):
    """Lifecycle of a run. Terminal states never change."""

    PENDING = "PENDING"
    RUNNING = "RUNNING"
    STOPPED = "STOPPED"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"

    @property
    def terminal(self) -> bool:
        """True for STOPPED, SUCCEEDED and FAILED."""
        return self in (RunState.STOPPED, RunState.SUCCEEDED, RunState.FAILED)
