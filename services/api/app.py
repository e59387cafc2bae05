"""The FastAPI application: wiring of store, launcher, monitor and routes.

``create_app(settings)`` builds an app whose lifespan opens (and migrates) the store, connects the
launcher (a Ray head at ``settings.ray_address``, or a local one it starts or reuses), reconciles
the store with Ray once, and then keeps reconciling in a background thread. Tests of pure HTTP
behaviour pass their own ``launcher``.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from importlib import metadata
from typing import Any

from fastapi import FastAPI
from fastapi.concurrency import run_in_threadpool
from fastapi.openapi.utils import get_openapi

from fp8rl.protocol import JobSpec
from fp8rl.services.api.launcher import JobLauncher
from fp8rl.services.api.monitor import RunMonitor
from fp8rl.services.api.problems import FieldProblem, Problem, install_problem_handlers
from fp8rl.services.api.ray_launcher import RayJobLauncher, ensure_local_ray
from fp8rl.services.api.routes import public_router, runs_router
from fp8rl.services.api.security import BodySizeLimit
from fp8rl.services.api.service import RunService
from fp8rl.services.api.settings import ApiSettings
from fp8rl.services.store import RunStore

log = logging.getLogger(__name__)


def create_app(settings: ApiSettings, *, launcher: JobLauncher | None = None) -> FastAPI:
    """The REST service for ``settings`` (see the module docstring)."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        store = await run_in_threadpool(RunStore.open, settings.db_url, migrate=True)
        released = await run_in_threadpool(store.release_unfinished_idempotency)
        if released:
            log.warning(
                "released %d Idempotency-Keys left in progress by a stopped server", released
            )
        jobs = launcher
        if jobs is None:
            address = settings.ray_address
            if address is None:
                head = await run_in_threadpool(ensure_local_ray, settings.data_dir)
                address = head.dashboard_url
            jobs = RayJobLauncher(address)
        monitor = RunMonitor(
            store,
            jobs,
            interval_s=settings.monitor_interval_s,
            stop_timeout_s=settings.stop_timeout_s,
            lost_job_grace_s=settings.lost_job_grace_s,
        )
        await run_in_threadpool(monitor.reconcile_once)
        monitor.start()
        app.state.settings = settings
        app.state.service = RunService(settings, store, jobs)
        app.state.monitor = monitor
        log.info("fp8rl API ready: store %s, Ray %s", store.engine.url, jobs.address)
        try:
            yield
        finally:
            monitor.stop()
            store.close()

    app = FastAPI(
        title="fp8rl",
        version=metadata.version("fp8rl"),
        summary="Start, watch and stop fp8rl runs.",
        lifespan=lifespan,
    )
    app.state.settings = settings
    install_problem_handlers(app)
    app.include_router(public_router)
    app.include_router(runs_router)
    app.add_middleware(BodySizeLimit, max_bytes=settings.max_body_bytes)
    app.openapi = lambda: _openapi(app)  # type: ignore[method-assign]
    return app


def _openapi(app: FastAPI) -> dict[str, Any]:
    """FastAPI's schema plus JobSpec (POST /runs reads its body itself) and Problem."""
    if app.openapi_schema:
        return app.openapi_schema
    schema = get_openapi(
        title=app.title, version=app.version, summary=app.summary, routes=app.routes
    )
    components = schema.setdefault("components", {}).setdefault("schemas", {})
    template = "#/components/schemas/{model}"
    for model in (JobSpec, Problem, FieldProblem):
        body = model.model_json_schema(ref_template=template)
        for name, sub in body.pop("$defs", {}).items():
            assert components.get(name, sub) == sub, f"OpenAPI schema name clash: {name}"
            components[name] = sub
        components[model.__name__] = body
    for path_item in schema.get("paths", {}).values():
        for operation in path_item.values():
            for parameter in operation.get("parameters", []):
                parameter["schema"] = _drop_null(parameter.get("schema", {}))
    app.openapi_schema = schema
    return schema


def _drop_null(schema: dict[str, Any]) -> dict[str, Any]:
    """``anyOf: [X, null]`` → ``X`` for parameters: an optional header or query value is absent,
    never the text "null" (pydantic emits the null branch for ``str | None``)."""
    options = schema.get("anyOf")
    if not options:
        return schema
    kept = [option for option in options if option.get("type") != "null"]
    if len(kept) != 1:
        return schema
    rest = {key: value for key, value in schema.items() if key != "anyOf"}
    return {**kept[0], **rest}
