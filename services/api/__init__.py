"""fp8rl's REST control API: start, watch and stop runs over HTTP (``fp8rl serve``).

FastAPI app (``app.create_app``) over the run store (``fp8rl.services.store``), runs executed as
Ray jobs (``ray_launcher``), a reconciliation thread (``monitor``) and an HTTP client for the CLI
(``client``). ``create_app`` imports FastAPI and SQLAlchemy (ray only when a Ray launcher is used);
``client`` needs only httpx.
"""

from __future__ import annotations

from typing import Any

__all__ = ["ApiSettings", "create_app"]


def __getattr__(name: str) -> Any:
    # Lazy, so that the CLI client (``fp8rl runs``, which needs only ``client``) does not import
    # FastAPI, SQLAlchemy and Alembic.
    if name == "create_app":
        from fp8rl.services.api.app import create_app

        return create_app
    if name == "ApiSettings":
        from fp8rl.services.api.settings import ApiSettings

        return ApiSettings
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
