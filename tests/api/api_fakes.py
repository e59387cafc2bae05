"""An in-memory ``JobLauncher`` for HTTP-level tests (no Ray): records submissions, and lets a
test set each job's state, block a submission, or make Ray look unreachable."""

from __future__ import annotations

import threading

from fp8rl.protocol import RunState
from fp8rl.services.api.launcher import JobLauncher, JobStatus, LauncherUnavailable


class FakeLauncher(JobLauncher):
    """Jobs start in ``initial_state`` (RUNNING); ``set_state`` moves them; ``block_submits`` holds ``submit``."""

    def __init__(self) -> None:
        self.address = "fake://ray"
        self.jobs: dict[str, JobStatus] = {}
        self.submitted: list[dict] = []
        self.stopped: list[str] = []
        self.deleted: list[str] = []
        self.logs: dict[str, list[str]] = {}
        self.unreachable = False
        self.initial_state = RunState.RUNNING
        self.release = threading.Event()
        self.release.set()
        self.submit_entered = threading.Event()

    def _check(self) -> None:
        if self.unreachable:
            raise LauncherUnavailable("fake Ray is down")

    def submit(self, *, job_id: str, entrypoint: str, env_vars: dict[str, str]) -> None:
        self.submit_entered.set()
        assert self.release.wait(timeout=30), "test never released the blocked submit"
        self._check()
        self.submitted.append({"job_id": job_id, "entrypoint": entrypoint, "env_vars": env_vars})
        self.jobs[job_id] = JobStatus(self.initial_state)

    def status(self, job_id: str) -> JobStatus | None:
        self._check()
        return self.jobs.get(job_id)

    def stop(self, job_id: str) -> None:
        self._check()
        self.stopped.append(job_id)
        if job_id in self.jobs and not self.jobs[job_id].state.terminal:
            self.jobs[job_id] = JobStatus(RunState.STOPPED, "Job was intentionally stopped.")

    def logs_tail(self, job_id: str, *, lines: int) -> list[str]:
        self._check()
        return self.logs.get(job_id, [])[-lines:]

    def delete(self, job_id: str) -> None:
        self.deleted.append(job_id)
        self.jobs.pop(job_id, None)

    def set_state(self, job_id: str, state: RunState, message: str = "") -> None:
        """Pretend Ray reports ``state`` for the job from now on."""
        self.jobs[job_id] = JobStatus(state, message)
