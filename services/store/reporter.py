"""The driver's side of the run store: report progress of a run the REST API started.

When ``fp8rl serve`` submits a run it starts the driver as a Ray job with two environment
variables: ``FP8RL_STORE_URL`` (SQLAlchemy URL of the run store) and ``FP8RL_RUN_ID``. The driver
calls ``reporter_from_env()``; without those variables (``fp8rl run``, a plain ``ray job submit``)
it gets None and reports nothing. The driver writes straight into the store rather than through
the API: no token to hand around, no HTTP retries, and progress survives an API restart.

Driver loop::

    reporter = reporter_from_env()
    if reporter:
        reporter.started(quant_fingerprint=fp, run_dir=str(run_dir))
    for step in range(1, spec.steps + 1):
        ...
        if reporter:
            reporter.step(step, metrics)
            if reporter.stop_requested():
                save_checkpoint(); reporter.finished(RunState.STOPPED); return
    if reporter:
        reporter.finished(RunState.SUCCEEDED)

Logs: ``log(line)`` lines are kept in the store and served by ``GET /runs/{id}/logs`` (the
default ``source=driver``); the process's whole stdout/stderr, tracebacks included, stays in
Ray's job logs (``GET /runs/{id}/logs?source=ray``). ``log_handler()`` forwards ``logging``
records. A crash that never reaches ``finished`` is caught by the service, which marks the run
FAILED with Ray's message and the tail of Ray's log.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from typing import Any

from fp8rl.protocol import RunState
from fp8rl.services.store.runs import RunStore

STORE_URL_ENV = "FP8RL_STORE_URL"
RUN_ID_ENV = "FP8RL_RUN_ID"


class RunReporter:
    """Writes one run's progress into the run store from inside the driver process.

    Args:
        store: the run store (opened without migrating: the service owns the schema).
        run_id: the run the service created.

    Raises:
        ValueError: ``run_id`` is not in the store (wrong URL or id).
    """

    def __init__(self, store: RunStore, run_id: str) -> None:
        if store.get_run(run_id) is None:
            raise ValueError(
                f"{RUN_ID_ENV}={run_id!r} is not a run in the store at {STORE_URL_ENV} "
                f"({store.engine.url!r}); was the job started by `fp8rl serve`?"
            )
        self.store = store
        self.run_id = run_id

    def started(self, *, quant_fingerprint: str | None, run_dir: str) -> None:
        """The driver is up and the quant handshake passed: PENDING → RUNNING.

        Args:
            quant_fingerprint: the QuantConfig fingerprint every worker agreed on (None: bf16).
            run_dir: the run directory (metrics, checkpoints) as the driver sees it.
        """
        self.store.mark_running(self.run_id, quant_fingerprint=quant_fingerprint, run_dir=run_dir)

    def step(self, step: int, metrics: Mapping[str, Any]) -> None:
        """Record the metrics of one RL step (floats; NaN/inf are stored as null).

        Raises:
            ValueError: negative step, empty metric name, or a non-numeric value.
        """
        self.store.add_metrics(self.run_id, step, metrics)

    def log(self, line: str) -> None:
        """Append a line to the run's log (``GET /runs/{id}/logs``); multi-line text is split."""
        self.store.add_log(self.run_id, line)

    def stop_requested(self) -> bool:
        """True once ``POST /runs/{id}/stop`` was called: checkpoint, then ``finished(STOPPED)``."""
        return self.store.stop_requested(self.run_id)

    def finished(self, state: RunState, error: str | None = None) -> None:
        """Record the terminal state (SUCCEEDED, STOPPED or FAILED with ``error``).

        A run that is already terminal (e.g. stopped by the service after a timeout) keeps its
        state: terminal states never change.

        Raises:
            ValueError: ``state`` is not terminal.
        """
        self.store.finish(self.run_id, RunState(state), error=error)

    def log_handler(self, level: int = logging.INFO) -> logging.Handler:
        """A ``logging`` handler that forwards formatted records to ``log``."""
        return _ReporterHandler(self, level)

    def close(self) -> None:
        """Release the store's connections."""
        self.store.close()


class _ReporterHandler(logging.Handler):
    def __init__(self, reporter: RunReporter, level: int) -> None:
        super().__init__(level)
        self.reporter = reporter
        self.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.reporter.log(self.format(record))
        except Exception:  # a logging handler must never raise into the caller
            self.handleError(record)


def reporter_from_env(environ: Mapping[str, str] | None = None) -> RunReporter | None:
    """The reporter of the run this process drives, or None when not started by the API.

    Reads ``FP8RL_STORE_URL`` and ``FP8RL_RUN_ID`` from ``environ`` (default ``os.environ``).

    Raises:
        ValueError: only one of the two variables is set, or the run is not in the store.
    """
    env = os.environ if environ is None else environ
    url, run_id = env.get(STORE_URL_ENV), env.get(RUN_ID_ENV)
    if not url and not run_id:
        return None
    if not url or not run_id:
        missing = STORE_URL_ENV if not url else RUN_ID_ENV
        raise ValueError(f"{missing} is not set but its partner is; set both or neither")
    return RunReporter(RunStore.open(url), run_id)
