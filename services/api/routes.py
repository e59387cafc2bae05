"""The HTTP endpoints under ``/api/v1`` (all but health and version need the bearer token).

``POST /runs`` reads the raw body itself (JSON JobSpec or YAML text) so that spec errors come from
the protocol's loader with field paths and did-you-mean hints, and so that an ``Idempotency-Key``
can be matched against the exact request: a replay (same key, same body and overrides) returns the
stored 201 response with ``Idempotent-Replayed: true``; the same key with another request is a 422;
while the first request with a key is still being processed, another one gets a 409. Keys of
requests that failed are released (the client may retry with the same key); completed keys are kept
24 hours. The key (with the request's hash) also fixes the run id and so the Ray job's submission
id: a retry after a server crash finds the run instead of creating another. Claims left
unfinished by a dead server are released when the server starts (one server per store).
"""

from __future__ import annotations

import hashlib
import json
from datetime import timedelta
from importlib import metadata
from typing import Annotated, Literal

from fastapi import APIRouter, Depends, Header, Path, Query, Request, Response
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse
from fastapi.security import HTTPAuthorizationCredentials
from starlette.responses import StreamingResponse

from fp8rl.protocol import RunState
from fp8rl.services.api.events import run_events
from fp8rl.services.api.models import (
    Health,
    LogTail,
    Metrics,
    MetricsList,
    RunDetail,
    RunList,
    RunSummary,
    Version,
)
from fp8rl.services.api.problems import ApiProblem, FieldProblem, problem_responses
from fp8rl.services.api.security import bearer_scheme, require_token
from fp8rl.services.api.service import RunService
from fp8rl.services.store.engine import schema_revision

API_PREFIX = "/api/v1"
RUN_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$"
MAX_INT = 2**31 - 1
IDEMPOTENCY_KEEP = timedelta(hours=24)
IDEMPOTENCY_STALE = timedelta(minutes=5)


class EventStream(StreamingResponse):
    """A ``text/event-stream`` response returned by a normal endpoint (FastAPI's
    ``EventSourceResponse`` as ``response_class`` expects a generator endpoint; this endpoint
    first validates the run and ``Last-Event-ID`` so errors are proper problem responses)."""

    media_type = "text/event-stream"


RunId = Annotated[str, Path(pattern=RUN_ID_PATTERN, description="Run id (from POST /runs).")]


def _auth(
    request: Request,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer_scheme)],
) -> None:
    require_token(request, credentials)


def _service(request: Request) -> RunService:
    return request.app.state.service


Service = Annotated[RunService, Depends(_service)]
runs_router = APIRouter(
    prefix=API_PREFIX,
    dependencies=[Depends(_auth)],
    responses=problem_responses(401, 422),
    tags=["runs"],
)
public_router = APIRouter(tags=["service"])


def _detail(service: RunService, run_id: str) -> RunDetail:
    run = service.get(run_id)
    return RunDetail.of_run(run, service.store.latest_metrics(run_id))


def _request_hash(content_type: str, overrides: list[str], body: bytes) -> str:
    digest = hashlib.sha256()
    digest.update(content_type.split(";")[0].strip().lower().encode())
    digest.update(b"\0" + json.dumps(overrides).encode() + b"\0")
    digest.update(body)
    return digest.hexdigest()


@runs_router.post(
    "/runs",
    status_code=201,
    response_model=RunDetail,
    summary="Start a run",
    responses=problem_responses(409, 413, 415, 429, 503),
    openapi_extra={
        "requestBody": {
            "required": True,
            "content": {
                "application/json": {"schema": {"$ref": "#/components/schemas/JobSpec"}},
                "application/yaml": {"schema": {"type": "string"}},
            },
        }
    },
)
async def create_run(
    request: Request,
    service: Service,
    override: Annotated[
        list[str], Query(description="Dotted overrides applied to the spec, e.g. `steps=2`.")
    ] = [],  # noqa: B006 (FastAPI copies defaults)
    idempotency_key: Annotated[
        str | None,
        Header(
            alias="Idempotency-Key",
            min_length=1,
            max_length=255,
            pattern=r"^[\x21-\x7e]+$",
            description="Makes retries safe: a replay returns the first response.",
        ),
    ] = None,
) -> JSONResponse:
    """Validate the JobSpec (JSON, or YAML text as `application/yaml`), submit the driver as a Ray
    job and return the new run (201, `Location` header)."""
    body = await request.body()
    content_type = request.headers.get("content-type", "application/json")
    key = idempotency_key
    if key is not None:
        request_hash = _request_hash(content_type, override, body)
        claim = await run_in_threadpool(
            service.store.claim_idempotency,
            key,
            request_hash,
            stale_after=IDEMPOTENCY_STALE,
            keep_for=IDEMPOTENCY_KEEP,
        )
        if claim.outcome == "mismatch":
            raise ApiProblem(
                422,
                "Idempotency-Key reused",
                "this Idempotency-Key was used with a different request body or overrides",
                kind="idempotency-key-reused",
                errors=[
                    FieldProblem(path="header.Idempotency-Key", message="used with another request")
                ],
            )
        if claim.outcome == "in_progress":
            raise ApiProblem(
                409,
                "Request in progress",
                "a request with this Idempotency-Key is still being processed; retry later",
                kind="idempotency-in-progress",
                headers={"Retry-After": "1"},
            )
        if claim.outcome == "replay":
            run_id = (claim.response or {}).get("id", "")
            return JSONResponse(
                claim.response,
                status_code=claim.status_code or 201,
                headers={"Location": f"{API_PREFIX}/runs/{run_id}", "Idempotent-Replayed": "true"},
            )
    try:
        job = await run_in_threadpool(service.resolve_spec, body, content_type, override)
        request_key = None if key is None else f"{key}\0{request_hash}"
        run = await run_in_threadpool(service.create, job, request_key=request_key)
        detail = await run_in_threadpool(_detail, service, run.id)
    except BaseException:
        if key is not None:
            await run_in_threadpool(service.store.release_idempotency, key)
        raise
    payload = detail.model_dump(mode="json")
    if key is not None:
        await run_in_threadpool(
            service.store.complete_idempotency, key, status_code=201, response=payload
        )
    return JSONResponse(
        payload, status_code=201, headers={"Location": f"{API_PREFIX}/runs/{run.id}"}
    )


@runs_router.get("/runs", response_model=RunList, summary="List runs")
def list_runs(
    service: Service,
    state: Annotated[RunState | None, Query(description="Only runs in this state.")] = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
    offset: Annotated[int, Query(ge=0, le=MAX_INT)] = 0,
) -> RunList:
    """Runs, newest first, one page at a time."""
    runs, total = service.store.list_runs(state=state, limit=limit, offset=offset)
    end = offset + len(runs)
    return RunList(
        runs=[RunSummary.of(r) for r in runs],
        total=total,
        next_offset=end if end < total else None,
    )


@runs_router.get(
    "/runs/{run_id}", response_model=RunDetail, summary="One run", responses=problem_responses(404)
)
def get_run(run_id: RunId, service: Service) -> RunDetail:
    """State, resolved spec, quant fingerprint, current step, latest metrics and error."""
    return _detail(service, run_id)


@runs_router.get(
    "/runs/{run_id}/metrics",
    response_model=MetricsList,
    summary="Metrics of a run",
    responses=problem_responses(404),
)
def get_metrics(
    run_id: RunId,
    service: Service,
    since: Annotated[
        int | None, Query(ge=0, le=MAX_INT, description="Only steps after this one.")
    ] = None,
) -> MetricsList:
    """All metric rows in step order, or only the steps after `since`."""
    service.get(run_id)
    rows = service.store.metrics(run_id, after=since)
    return MetricsList(run_id=run_id, metrics=[Metrics.of(r) for r in rows])


@runs_router.get(
    "/runs/{run_id}/events",
    response_class=EventStream,
    summary="Live events (SSE)",
    responses={
        200: {
            "description": "`text/event-stream`: `step` events (id = step) and `state` events.",
            "content": {"text/event-stream": {"schema": {"type": "string"}}},
        },
        **problem_responses(404),
    },
)
async def run_events_stream(
    run_id: RunId,
    request: Request,
    service: Service,
    last_event_id: Annotated[
        str | None,
        Header(
            alias="Last-Event-ID",
            pattern=r"^[0-9]{1,9}$",
            description="Resume after this step (the `id` of the last event received).",
        ),
    ] = None,
) -> EventStream:
    """Server-sent events: one `step` event per step, `state` events on changes; ends after
    the terminal state. Reconnect with `Last-Event-ID` to resume."""
    after = int(last_event_id) if last_event_id is not None else None
    await run_in_threadpool(service.get, run_id)
    poll_s = request.app.state.settings.sse_poll_s
    return EventStream(
        run_events(service.store, run_id, after=after, poll_s=poll_s),
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )


@runs_router.get(
    "/runs/{run_id}/logs",
    response_model=LogTail,
    summary="Log tail",
    responses=problem_responses(404, 503),
)
def get_logs(
    run_id: RunId,
    service: Service,
    tail: Annotated[int, Query(ge=1, le=10_000)] = 200,
    source: Annotated[
        Literal["driver", "ray"],
        Query(description="`driver`: lines the driver reported; `ray`: the job's stdout/stderr."),
    ] = "driver",
) -> LogTail:
    """The last `tail` lines of the run's log."""
    run = service.get(run_id)
    return LogTail(run_id=run_id, source=source, lines=service.logs(run, source=source, lines=tail))


@runs_router.post(
    "/runs/{run_id}/stop",
    status_code=202,
    response_model=RunDetail,
    summary="Stop a run",
    responses=problem_responses(404, 409, 503),
)
def stop_run(run_id: RunId, service: Service) -> RunDetail:
    """Graceful stop: the driver checkpoints and exits, the run ends STOPPED (Ray stops the job
    if the driver has not exited within the service's stop timeout)."""
    service.stop(run_id)
    return _detail(service, run_id)


@runs_router.delete(
    "/runs/{run_id}",
    status_code=204,
    summary="Delete a finished run",
    responses=problem_responses(404, 409),
)
def delete_run(run_id: RunId, service: Service) -> Response:
    """Delete a terminal run: its records, metrics, logs and server-side directory."""
    service.delete(run_id)
    return Response(status_code=204)


def _health(request: Request) -> Health:
    state = request.app.state
    try:
        state.service.store.list_runs(limit=1)
    except Exception as exc:
        raise ApiProblem(503, "Store unavailable", f"{type(exc).__name__}: {exc}") from None
    return Health(
        status="ok",
        store="ok",
        ray_address=state.service.launcher.address,
        ray_reachable=state.monitor.reachable,
    )


def _version(request: Request) -> Version:
    try:
        ray_version = metadata.version("ray")
    except metadata.PackageNotFoundError:
        ray_version = None
    return Version(
        fp8rl=metadata.version("fp8rl"),
        api="v1",
        ray=ray_version,
        store_schema=schema_revision(request.app.state.service.store.engine) or "none",
    )


public_router.add_api_route("/healthz", _health, response_model=Health, summary="Liveness")
public_router.add_api_route(
    f"{API_PREFIX}/healthz", _health, response_model=Health, include_in_schema=False
)
public_router.add_api_route(
    f"{API_PREFIX}/version", _version, response_model=Version, summary="Versions"
)
public_router.add_api_route("/version", _version, response_model=Version, include_in_schema=False)
