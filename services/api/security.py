"""Bearer-token authentication and the request size limit.

The token is compared in constant time (``hmac.compare_digest`` on bytes) so response timing says
nothing about how much of a guess was right. Failures answer 401 with ``WWW-Authenticate: Bearer``
(RFC 6750: ``error="invalid_token"`` when a token was sent but is wrong).

The size limit is an ASGI middleware in front of everything: a declared ``Content-Length`` above
the limit is refused before the body is read, and a chunked body is counted as it arrives.
"""

from __future__ import annotations

import hmac
import json

from fastapi import Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from fp8rl.services.api.problems import PROBLEM_MEDIA_TYPE, ApiProblem

REALM = "fp8rl"
bearer_scheme = HTTPBearer(auto_error=False, description="The API token (`FP8RL_API_TOKEN`).")


def check_token(expected: str, credentials: HTTPAuthorizationCredentials | None) -> None:
    """Accept the request or raise a 401 problem.

    Raises:
        ApiProblem: 401, no bearer token or a wrong one.
    """
    if credentials is None or credentials.scheme.lower() != "bearer":
        raise ApiProblem(
            401,
            "Unauthorized",
            "send the API token as `Authorization: Bearer <token>`",
            kind="unauthorized",
            headers={"WWW-Authenticate": f'Bearer realm="{REALM}"'},
        )
    if not hmac.compare_digest(credentials.credentials.encode(), expected.encode()):
        raise ApiProblem(
            401,
            "Unauthorized",
            "the bearer token is not valid",
            kind="unauthorized",
            headers={
                "WWW-Authenticate": f'Bearer realm="{REALM}", error="invalid_token", '
                'error_description="the token is not valid"'
            },
        )


def require_token(request: Request, credentials: HTTPAuthorizationCredentials | None) -> None:
    """Dependency body: compare against the token of the running app."""
    check_token(request.app.state.settings.token.get_secret_value(), credentials)


class _TooLarge(StarletteHTTPException):
    """Raised while the body streams in; the app's HTTP error handler turns it into a 413."""

    def __init__(self, max_bytes: int) -> None:
        super().__init__(413, f"request bodies are limited to {max_bytes} bytes")


class BodySizeLimit:
    """ASGI middleware: answer 413 (problem+json) to request bodies above ``max_bytes``."""

    def __init__(self, app: ASGIApp, *, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = _content_length(scope)
        if declared is not None and declared > self.max_bytes:
            await self._refuse(send)
            return
        received = 0
        started = False

        async def counting_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    raise _TooLarge(self.max_bytes)
            return message

        async def tracking_send(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, counting_receive, tracking_send)
        except _TooLarge:
            if not started:
                await self._refuse(send)

    async def _refuse(self, send: Send) -> None:
        body = json.dumps(
            {
                "type": "about:blank",
                "title": "Content Too Large",
                "status": 413,
                "detail": f"request bodies are limited to {self.max_bytes} bytes",
            }
        ).encode()
        await send(
            {
                "type": "http.response.start",
                "status": 413,
                "headers": [
                    (b"content-type", PROBLEM_MEDIA_TYPE.encode()),
                    (b"content-length", str(len(body)).encode()),
                    (b"connection", b"close"),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})


def _content_length(scope: Scope) -> int | None:
    for name, value in scope.get("headers", []):
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None
