"""Where runs execute: the launcher interface the service talks to.

One small ABC, one implementation per backend file: ``ray_launcher.RayJobLauncher`` submits the
driver as a Ray job (the production path, the same driver ``ray job submit`` and ``fp8rl run``
execute). Tests of pure HTTP behaviour plug in a fake with the same five methods.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

from fp8rl.protocol import RunState


class LauncherUnavailable(RuntimeError):
    """The execution backend cannot be reached (the API answers 503 and retries later)."""


@dataclass(frozen=True)
class JobStatus:
    """A job's state as the backend reports it, and its message (e.g. Ray's failure reason)."""

    state: RunState
    message: str = ""


class JobLauncher(ABC):
    """Starts, observes and stops driver jobs. Job ids are chosen by the caller."""

    address: str
    """Where jobs go (shown by /healthz)."""

    @abstractmethod
    def submit(self, *, job_id: str, entrypoint: str, env_vars: dict[str, str]) -> None:
        """Start ``entrypoint`` (a shell command) as job ``job_id`` with extra environment.

        Raises:
            LauncherUnavailable: the backend cannot be reached or refused the job.
        """

    @abstractmethod
    def status(self, job_id: str) -> JobStatus | None:
        """The job's state, or None when the backend does not know the id.

        Raises:
            LauncherUnavailable: the backend cannot be reached.
        """

    @abstractmethod
    def stop(self, job_id: str) -> None:
        """Stop the job (SIGTERM, then SIGKILL); a finished or unknown job is not an error."""

    @abstractmethod
    def logs_tail(self, job_id: str, *, lines: int) -> list[str]:
        """The last ``lines`` lines of the job's stdout/stderr ([] when unknown)."""

    @abstractmethod
    def delete(self, job_id: str) -> None:
        """Forget a finished job's record and logs; unknown ids are ignored."""
