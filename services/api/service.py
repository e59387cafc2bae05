"""What the endpoints do: create a run from a spec, stop it, delete it.

Creating a run: parse the body (JSON JobSpec or YAML text) and the ``override`` query values with
the protocol's loader, so errors name the field path exactly as ``fp8rl validate`` does; pick a
run id and a server-owned directory ``DATA_DIR/runs/<run id>/``; write the resolved spec there as
``spec.yaml``; record the run PENDING; submit the driver. The request never names a server path:
``output_dir`` is replaced by the run's directory, and ``checkpoint.resume`` accepts only
``auto``/``never`` (a path would let a request read any checkpoint on the server).

What the driver itself opens (``model.path``, a dataset file, a reward function's module) is job
input, exactly as with ``ray job submit``: whoever holds the API token may run jobs.
"""

from __future__ import annotations

import hashlib
import json
import secrets
import shlex
import shutil
import threading
from typing import Any

import yaml

from fp8rl.protocol import JobSpec, RunState, SpecError, apply_override
from fp8rl.protocol.limits import MAX_DEPTH, LimitError, load_yaml_bounded
from fp8rl.protocol.loading import validate_job_spec
from fp8rl.services.api.launcher import JobLauncher, LauncherUnavailable
from fp8rl.services.api.policy import policy_problems
from fp8rl.services.api.problems import ApiProblem, spec_problem
from fp8rl.services.api.settings import ApiSettings, default_entrypoint
from fp8rl.services.preflight import preflight
from fp8rl.services.store import RunRecord, RunStore
from fp8rl.services.store.engine import normalize_url, url_to_string
from fp8rl.services.store.reporter import RUN_ID_ENV, STORE_URL_ENV

JSON_TYPES = ("application/json",)
YAML_TYPES = ("application/yaml", "application/x-yaml", "text/yaml", "text/x-yaml", "text/plain")
SPEC_FILE = "spec.yaml"
RESUME_ALLOWED = ("auto", "never")
SUBMIT_FAILED = "could not submit"
"""Error prefix of a run whose job Ray never received (an idempotent retry starts it afresh)."""
ADMISSION_RETRY_S = 30
"""``Retry-After`` of a 429 for too many active runs (seconds)."""


def parse_spec_body(body: bytes, content_type: str, overrides: list[str]) -> dict[str, Any]:
    """The request body as a plain dict with ``overrides`` applied (not yet validated).

    Raises:
        SpecError: empty body, not UTF-8, malformed JSON/YAML, not a mapping, bad override.
        ApiProblem: 415 for another content type.
    """
    media = content_type.split(";")[0].strip().lower() or "application/json"
    if media not in JSON_TYPES + YAML_TYPES:
        raise ApiProblem(
            415,
            "Unsupported Media Type",
            f"send the JobSpec as application/json or YAML text (application/yaml), not {media}",
            kind="unsupported-media-type",
        )
    if not body.strip():
        raise SpecError(["(body): empty; send a JobSpec (an empty mapping {} means all defaults)"])
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise SpecError([f"(body): not UTF-8 text ({exc.reason} at byte {exc.start})"]) from None
    try:
        data = json.loads(text) if media in JSON_TYPES else load_yaml_bounded(text)
    except LimitError as exc:
        raise SpecError([f"(body): refused, {exc}"]) from None
    except RecursionError:
        raise SpecError(
            [f"(body): refused, nested deeper than {MAX_DEPTH} levels (limit MAX_DEPTH)"]
        ) from None
    except (ValueError, yaml.YAMLError) as exc:
        kind = "JSON" if media in JSON_TYPES else "YAML"
        raise SpecError([f"(body): not valid {kind}: {exc}"]) from None
    if not isinstance(data, dict):
        raise SpecError([f"(top level): must be a mapping, got {type(data).__name__}"])
    for item in overrides:
        apply_override(data, item)
    return data


def run_id_for(name: str, request_key: str | None) -> str:
    """``<name>-<10 hex>``: random, or derived from ``request_key`` (same key, same id)."""
    if request_key is None:
        return f"{name}-{secrets.token_hex(5)}"
    return f"{name}-{hashlib.sha256(request_key.encode()).hexdigest()[:10]}"


class RunService:
    """Run lifecycle on top of the store and a launcher."""

    def __init__(self, settings: ApiSettings, store: RunStore, launcher: JobLauncher) -> None:
        self.settings = settings
        self.store = store
        self.launcher = launcher
        self.runs_root = (settings.data_dir / "runs").resolve()
        self.entrypoint = settings.driver_entrypoint or default_entrypoint(settings.ray_address)
        self.store_url = url_to_string(normalize_url(settings.db_url))
        self._admission = threading.Lock()  # count active runs and record a new one atomically

    def resolve_spec(self, body: bytes, content_type: str, overrides: list[str]) -> JobSpec:
        """Validate a request's spec.

        Raises:
            ApiProblem: 422 naming each invalid field, or 415.
        """
        try:
            data = parse_spec_body(body, content_type, overrides)
            job = validate_job_spec(data)
            preflight(job, local=False)  # the cluster's files are not the server's to read
            problems = policy_problems(job, self.settings.policy, self.settings.data_dir)
            if problems:
                raise SpecError(problems)
        except SpecError as exc:
            raise spec_problem(exc) from None
        if job.checkpoint.resume not in RESUME_ALLOWED:
            raise spec_problem(
                SpecError(
                    [
                        f"checkpoint.resume: the API accepts only {list(RESUME_ALLOWED)} "
                        f"(a run resumes from its own directory); got {job.checkpoint.resume!r}"
                    ]
                )
            )
        return job

    def create(self, job: JobSpec, *, request_key: str | None = None) -> RunRecord:
        """Record and submit a run of ``job``.

        ``request_key`` (the Idempotency-Key with the request's hash) fixes the run id, hence the
        Ray job's submission id: a retry after a server crash finds the run it created before
        (and submits it only if Ray never got it) instead of starting a second one.

        Raises:
            ApiProblem: 429 when ``max_active_runs`` runs are already active; 503 when the job
                could not be submitted (the run is recorded FAILED).
        """
        run_id = run_id_for(job.name, request_key)
        existing = self.store.get_run(run_id)
        if existing is not None and (existing.error or "").startswith(SUBMIT_FAILED):
            self.store.delete_run(run_id)  # Ray never had it: the retry is a fresh attempt
        elif existing is not None:
            return self._resubmit_if_lost(existing)
        with self._admission:
            self.admit()
            run = self._record(job, run_id)
        self._submit(run)
        return run

    def _resubmit_if_lost(self, run: RunRecord) -> RunRecord:
        """A run found again by its idempotent id: submit it when Ray never received it."""
        try:
            known = self.launcher.status(run.ray_job_id) is not None
        except LauncherUnavailable:
            known = True  # cannot tell: do not risk a second job; the monitor will judge
        if not known and run.state is RunState.PENDING:
            self._submit(run)
        return run

    def _submit(self, run: RunRecord) -> None:
        """Submit the driver of a recorded run (503 and FAILED when Ray is unavailable)."""
        spec_path = self.runs_root / run.id / SPEC_FILE
        try:
            self.launcher.submit(
                job_id=run.ray_job_id,
                entrypoint=f"{self.entrypoint} {shlex.quote(str(spec_path))}",
                env_vars={STORE_URL_ENV: self.store_url, RUN_ID_ENV: run.id},
            )
        except LauncherUnavailable as exc:
            self.store.finish(run.id, RunState.FAILED, error=f"{SUBMIT_FAILED}: {exc}")
            raise ApiProblem(
                503,
                "Ray unavailable",
                f"run {run.id} was recorded FAILED: {exc}",
                kind="launcher-unavailable",
                headers={"Retry-After": "10"},
            ) from None

    def _record(self, job: JobSpec, run_id: str) -> RunRecord:
        """Write ``spec.yaml`` in the run's server directory and record the run PENDING."""
        root = self.runs_root / run_id
        root.mkdir(parents=True, exist_ok=True)  # a crash may have left it behind
        job.output_dir = str(root)
        spec = job.model_dump(mode="json")
        (root / SPEC_FILE).write_text(yaml.safe_dump(spec, sort_keys=False))
        fingerprint = None if job.precision.mode == "bf16" else job.precision.quant.fingerprint()
        return self.store.create_run(
            run_id=run_id,
            name=job.name,
            spec=spec,
            total_steps=job.steps,
            quant_fingerprint=fingerprint,
            run_dir=str(root / job.name),
            ray_job_id=f"fp8rl-{run_id}",
        )

    def admit(self) -> None:
        """Refuse (429, ``Retry-After``) when ``max_active_runs`` runs are PENDING/RUNNING.

        Raises:
            ApiProblem: 429.
        """
        active = len(self.store.active_runs())
        limit = self.settings.max_active_runs
        if active >= limit:
            raise ApiProblem(
                429,
                "Too Many Requests",
                f"{active} runs are active and the server allows {limit} (max_active_runs); "
                "retry when one has finished",
                kind="too-many-active-runs",
                headers={"Retry-After": str(ADMISSION_RETRY_S)},
            )

    def get(self, run_id: str) -> RunRecord:
        """The run or a 404 problem."""
        run = self.store.get_run(run_id)
        if run is None:
            raise ApiProblem(404, "Not Found", f"no run {run_id!r}", kind="run-not-found")
        return run

    def stop(self, run_id: str) -> RunRecord:
        """Graceful stop: a RUNNING run's driver checkpoints and exits (Ray stops it after
        ``stop_timeout_s``); a PENDING run has nothing to save and its job is stopped at once.

        Raises:
            ApiProblem: 404 unknown run, 409 already terminal, 503 Ray unreachable.
        """
        run = self.get(run_id)
        if run.state.terminal:
            raise ApiProblem(
                409, "Conflict", f"run {run_id} is already {run.state}", kind="run-terminal"
            )
        if run.state is RunState.PENDING:
            try:
                self.launcher.stop(run.ray_job_id)
            except LauncherUnavailable as exc:
                raise ApiProblem(
                    503, "Ray unavailable", str(exc), kind="launcher-unavailable"
                ) from None
            self.store.finish(run_id, RunState.STOPPED, error="stopped before the driver started")
        else:
            self.store.request_stop(run_id)
        return self.get(run_id)

    def delete(self, run_id: str) -> None:
        """Delete a terminal run: its records, Ray's job record and its server directory.

        Raises:
            ApiProblem: 404 unknown, 409 still active.
        """
        run = self.get(run_id)
        if not run.state.terminal or not self.store.delete_run(run_id):
            raise ApiProblem(
                409, "Conflict", f"run {run_id} is {run.state}; stop it first", kind="run-active"
            )
        self.launcher.delete(run.ray_job_id)
        root = (self.runs_root / run_id).resolve()
        if root.parent == self.runs_root and root.is_dir():
            shutil.rmtree(root, ignore_errors=True)

    def logs(self, run: RunRecord, *, source: str, lines: int) -> list[str]:
        """Last ``lines`` of the driver's reported log (``driver``) or of Ray's job log (``ray``)."""
        if source == "driver":
            return self.store.log_tail(run.id, lines=lines)
        try:
            return self.launcher.logs_tail(run.ray_job_id, lines=lines)
        except LauncherUnavailable as exc:
            raise ApiProblem(
                503, "Ray unavailable", str(exc), kind="launcher-unavailable"
            ) from None
