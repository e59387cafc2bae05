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

import json
import secrets
import shlex
import shutil
from typing import Any

import yaml

from fp8rl.protocol import JobSpec, RunState, SpecError, apply_override
from fp8rl.protocol.loading import validate_job_spec
from fp8rl.services.api.launcher import JobLauncher, LauncherUnavailable
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
        data = json.loads(text) if media in JSON_TYPES else yaml.safe_load(text)
    except (ValueError, yaml.YAMLError) as exc:
        kind = "JSON" if media in JSON_TYPES else "YAML"
        raise SpecError([f"(body): not valid {kind}: {exc}"]) from None
    if not isinstance(data, dict):
        raise SpecError([f"(top level): must be a mapping, got {type(data).__name__}"])
    for item in overrides:
        apply_override(data, item)
    return data


class RunService:
    """Run lifecycle on top of the store and a launcher."""

    def __init__(self, settings: ApiSettings, store: RunStore, launcher: JobLauncher) -> None:
        self.settings = settings
        self.store = store
        self.launcher = launcher
        self.runs_root = (settings.data_dir / "runs").resolve()
        self.entrypoint = settings.driver_entrypoint or default_entrypoint(settings.ray_address)
        self.store_url = url_to_string(normalize_url(settings.db_url))

    def resolve_spec(self, body: bytes, content_type: str, overrides: list[str]) -> JobSpec:
        """Validate a request's spec.

        Raises:
            ApiProblem: 422 naming each invalid field, or 415.
        """
        try:
            data = parse_spec_body(body, content_type, overrides)
            job = validate_job_spec(data)
            preflight(job, local=False)  # the cluster's files are not the server's to read
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

    def create(self, job: JobSpec) -> RunRecord:
        """Record and submit a run of ``job``.

        Raises:
            ApiProblem: 503 when the job could not be submitted (the run is recorded FAILED).
        """
        run_id = f"{job.name}-{secrets.token_hex(5)}"
        root = self.runs_root / run_id
        root.mkdir(parents=True, exist_ok=False)
        job.output_dir = str(root)
        spec_path = root / SPEC_FILE
        spec = job.model_dump(mode="json")
        spec_path.write_text(yaml.safe_dump(spec, sort_keys=False))
        fingerprint = None if job.precision.mode == "bf16" else job.precision.quant.fingerprint()
        run = self.store.create_run(
            run_id=run_id,
            name=job.name,
            spec=spec,
            total_steps=job.steps,
            quant_fingerprint=fingerprint,
            run_dir=str(root / job.name),
            ray_job_id=f"fp8rl-{run_id}",
        )
        try:
            self.launcher.submit(
                job_id=run.ray_job_id,
                entrypoint=f"{self.entrypoint} {shlex.quote(str(spec_path))}",
                env_vars={STORE_URL_ENV: self.store_url, RUN_ID_ENV: run_id},
            )
        except LauncherUnavailable as exc:
            self.store.finish(run_id, RunState.FAILED, error=f"could not submit: {exc}")
            raise ApiProblem(
                503,
                "Ray unavailable",
                f"run {run_id} was recorded FAILED: {exc}",
                kind="launcher-unavailable",
                headers={"Retry-After": "10"},
            ) from None
        return run

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
