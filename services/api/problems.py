"""Errors as RFC 9457 problem details (``application/problem+json``).

Every error response of the API has the same shape: ``type``, ``title``, ``status``, ``detail``
and, for invalid input, ``errors``: a list of ``{"path": "rollout.max_tokens", "message": ...}``
(the dotted field path of the job spec, or ``query.limit`` / ``header.Idempotency-Key`` for
other inputs). Unexpected exceptions become a 500 problem without the traceback (it goes to the
server log instead).
"""

from __future__ import annotations

import logging
import re
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel
from starlette.exceptions import HTTPException as StarletteHTTPException

from fp8rl.protocol import SpecError

PROBLEM_MEDIA_TYPE = "application/problem+json"
PROBLEM_TYPE_BASE = "https://fp8rl.dev/problems/"
_PATH_LINE = re.compile(r"^(\([a-z ]+\)|[A-Za-z0-9_\-]+(?:\.[A-Za-z0-9_\-]+)*): (.*)$", re.S)
log = logging.getLogger(__name__)


class FieldProblem(BaseModel):
    """One invalid field: its dotted path and why."""

    path: str
    message: str


class Problem(BaseModel):
    """RFC 9457 problem details."""

    type: str = "about:blank"
    title: str
    status: int
    detail: str | None = None
    instance: str | None = None
    errors: list[FieldProblem] | None = None


class ApiProblem(Exception):
    """Raise to answer with a problem+json response."""

    def __init__(
        self,
        status: int,
        title: str,
        detail: str | None = None,
        *,
        kind: str | None = None,
        errors: list[FieldProblem] | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(detail or title)
        self.problem = Problem(
            type=PROBLEM_TYPE_BASE + kind if kind else "about:blank",
            title=title,
            status=status,
            detail=detail,
            errors=errors,
        )
        self.headers = headers or {}


def problem_response(problem: Problem, headers: dict[str, str] | None = None) -> JSONResponse:
    """The JSON response for a problem."""
    return JSONResponse(
        problem.model_dump(exclude_none=True),
        status_code=problem.status,
        media_type=PROBLEM_MEDIA_TYPE,
        headers=headers,
    )


def spec_problem(exc: SpecError) -> ApiProblem:
    """422 for an invalid job spec; each ``SpecError`` line becomes ``{path, message}``."""
    errors = []
    for line in exc.problems:
        match = _PATH_LINE.match(line)
        path, message = (match.group(1), match.group(2)) if match else ("(spec)", line)
        errors.append(FieldProblem(path=path, message=message))
    detail = "; ".join(f"{e.path}: {e.message}" for e in errors)
    return ApiProblem(422, "Invalid job spec", detail, kind="invalid-spec", errors=errors)


def _validation_path(loc: tuple[Any, ...]) -> str:
    return ".".join(str(part) for part in loc) or "(request)"


def install_problem_handlers(app: FastAPI) -> None:
    """Route every error through problem+json."""

    @app.exception_handler(ApiProblem)
    async def _api_problem(_request: Request, exc: ApiProblem) -> JSONResponse:
        return problem_response(exc.problem, exc.headers)

    @app.exception_handler(RequestValidationError)
    async def _invalid_request(_request: Request, exc: RequestValidationError) -> JSONResponse:
        errors = [
            FieldProblem(path=_validation_path(tuple(e.get("loc", ()))), message=e.get("msg", ""))
            for e in exc.errors()
        ]
        detail = "; ".join(f"{e.path}: {e.message}" for e in errors)
        problem = Problem(
            type=PROBLEM_TYPE_BASE + "invalid-request",
            title="Invalid request",
            status=422,
            detail=detail,
            errors=errors,
        )
        return problem_response(problem)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(_request: Request, exc: StarletteHTTPException) -> JSONResponse:
        detail = exc.detail if isinstance(exc.detail, str) else None
        problem = Problem(title=_reason(exc.status_code), status=exc.status_code, detail=detail)
        return problem_response(problem, dict(exc.headers or {}))

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error in %s %s", request.method, request.url.path)
        problem = Problem(
            title="Internal Server Error",
            status=500,
            detail=f"{type(exc).__name__}; see the service log",
        )
        return problem_response(problem)


def _reason(status: int) -> str:
    from http import HTTPStatus

    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return "Error"


def problem_responses(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI ``responses`` entries for problem+json errors."""
    return {
        status: {
            "description": _reason(status),
            "content": {PROBLEM_MEDIA_TYPE: {"schema": {"$ref": "#/components/schemas/Problem"}}},
        }
        for status in statuses
    }
