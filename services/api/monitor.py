"""Reconciliation of the run store with the launcher's job states (at start, then every second).

The driver reports its own progress, but a process can die without saying so (OOM kill, node
loss, a crash before ``finished``) and the service itself can be down while runs progress. So a
background thread compares every active run with its job:

| job (Ray)            | run (store)          | action                                               |
|----------------------|----------------------|------------------------------------------------------|
| RUNNING              | PENDING              | → RUNNING                                            |
| SUCCEEDED            | active               | → SUCCEEDED (STOPPED when a stop was requested)      |
| STOPPED              | active               | → STOPPED                                            |
| FAILED               | active               | → FAILED with Ray's message and the log tail         |
| unknown to Ray       | active, older than grace | → FAILED (cluster restarted or job deleted)      |
| still active         | stop requested longer ago than ``stop_timeout_s`` | stop the job → STOPPED |

The first pass runs synchronously when the service starts, before it answers requests, so a
restarted service shows runs that ended while it was down in their final state.
"""

from __future__ import annotations

import logging
import threading

from fp8rl.protocol import RunState
from fp8rl.services.api.launcher import JobLauncher, LauncherUnavailable
from fp8rl.services.store import RunRecord, RunStore
from fp8rl.services.store.runs import utcnow

log = logging.getLogger(__name__)
FAILURE_LOG_LINES = 20
"""Lines of the job's log appended to the error of a run whose job failed without reporting."""


class RunMonitor:
    """Keeps active runs in step with their jobs; see the module docstring for the rules."""

    def __init__(
        self,
        store: RunStore,
        launcher: JobLauncher,
        *,
        interval_s: float,
        stop_timeout_s: float,
        lost_job_grace_s: float,
    ) -> None:
        self.store = store
        self.launcher = launcher
        self.interval_s = interval_s
        self.stop_timeout_s = stop_timeout_s
        self.lost_job_grace_s = lost_job_grace_s
        self.reachable: bool | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def reconcile_once(self) -> None:
        """One pass over the active runs (Ray unreachable: note it and try again next pass)."""
        try:
            for run in self.store.active_runs():
                self._reconcile(run)
            self.reachable = True
        except LauncherUnavailable as exc:
            if self.reachable is not False:
                log.warning("cannot reconcile runs: %s", exc)
            self.reachable = False

    def _reconcile(self, run: RunRecord) -> None:
        job = self.launcher.status(run.ray_job_id)
        now = utcnow()
        if job is None:
            if (now - run.created_at).total_seconds() > self.lost_job_grace_s:
                self.store.finish(
                    run.id,
                    RunState.FAILED,
                    error=f"Ray at {self.launcher.address} does not know job {run.ray_job_id} "
                    "(the cluster was restarted or the job deleted)",
                )
            return
        if job.state is RunState.RUNNING and run.state is RunState.PENDING:
            self.store.mark_running(run.id)
        elif job.state is RunState.SUCCEEDED:
            final = RunState.STOPPED if run.stop_requested else RunState.SUCCEEDED
            self.store.finish(run.id, final)
        elif job.state is RunState.STOPPED:
            error = (
                None
                if run.stop_requested
                else f"the Ray job was stopped outside fp8rl: {job.message}"
            )
            self.store.finish(run.id, RunState.STOPPED, error=error)
        elif job.state is RunState.FAILED:
            self.store.finish(run.id, RunState.FAILED, error=self._failure(run, job.message))
        if (
            not job.state.terminal
            and run.stop_requested_at is not None
            and (now - run.stop_requested_at).total_seconds() > self.stop_timeout_s
        ):
            self.launcher.stop(run.ray_job_id)
            self.store.finish(
                run.id,
                RunState.STOPPED,
                error=f"the driver did not stop within {self.stop_timeout_s:g} s of the stop "
                "request; the Ray job was stopped (no final checkpoint)",
            )

    def _failure(self, run: RunRecord, message: str) -> str:
        try:
            tail = self.launcher.logs_tail(run.ray_job_id, lines=FAILURE_LOG_LINES)
        except LauncherUnavailable:
            tail = []
        text = message or "the Ray job failed"
        if tail:  # Ray's message may embed up to 20k characters of log: keep its first part
            text = text.split(", last available logs")[0].splitlines()[0]
            text += "\n--- last lines of the job log ---\n" + "\n".join(tail)
        return text

    def start(self) -> None:
        """Run ``reconcile_once`` every ``interval_s`` in a daemon thread."""
        self._thread = threading.Thread(target=self._loop, name="fp8rl-run-monitor", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.reconcile_once()
            except Exception:  # keep monitoring; one bad pass must not end reconciliation
                log.exception("run reconciliation failed")

    def stop(self) -> None:
        """Stop the thread (waits for the current pass)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
