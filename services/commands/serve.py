"""``fp8rl serve``: the REST control API (uvicorn) on 127.0.0.1:8000 unless told otherwise."""

from __future__ import annotations

import ipaddress
import logging
from pathlib import Path
from typing import Annotated

import typer

from fp8rl.services.commands.common import fail


def serve(
    host: Annotated[
        str, typer.Option(help="Interface to bind; 0.0.0.0 exposes the API to the network.")
    ] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="TCP port.", min=1, max=65535)] = 8000,
    db: Annotated[
        str | None,
        typer.Option(
            help="Run store URL (SQLAlchemy): sqlite:////path/runs.db or "
            "postgresql+psycopg://USER@HOST/DB. Default: sqlite in the data directory.",
            envvar="FP8RL_STORE_URL",
        ),
    ] = None,
    ray_address: Annotated[
        str | None,
        typer.Option(
            help="Ray dashboard URL for job submission (http://head:8265). Default: a local Ray "
            "started (or reused) by the service.",
            envvar="RAY_ADDRESS",
        ),
    ] = None,
    token_file: Annotated[
        Path | None,
        typer.Option(
            help="File holding the bearer token. Default: $FP8RL_API_TOKEN, else DATA_DIR/api-token "
            "(created with a random token)."
        ),
    ] = None,
    data_dir: Annotated[
        Path,
        typer.Option(
            help="Server-owned directory for run directories and the default store.",
            envvar="FP8RL_DATA_DIR",
        ),
    ] = Path("~/.fp8rl"),
    stop_timeout: Annotated[
        float,
        typer.Option(
            help="Seconds a stopping driver gets to checkpoint before Ray stops the job.", min=0.1
        ),
    ] = 120.0,
    max_body_bytes: Annotated[int, typer.Option(help="Largest request body.", min=1024)] = 1 << 20,
    driver_entrypoint: Annotated[
        str | None,
        typer.Option(
            help="Driver command (the spec path is appended). Default: python -m fp8rl.services.driver.",
            envvar="FP8RL_DRIVER_ENTRYPOINT",
            hidden=True,
        ),
    ] = None,
    max_active_runs: Annotated[
        int, typer.Option(help="Runs active at once; more POSTs get 429.", min=1)
    ] = 8,
    allow_path: Annotated[
        list[Path] | None,
        typer.Option(
            help="Root API specs may name model/data paths under (repeatable; the data "
            "directory is always allowed)."
        ),
    ] = None,
    allow_reward_module: Annotated[
        list[str] | None,
        typer.Option(help="Module prefix whose reward functions API specs may use (repeatable)."),
    ] = None,
    allow_reward_url: Annotated[
        list[str] | None,
        typer.Option(help="URL prefix a remote reward of an API spec may call (repeatable)."),
    ] = None,
    log_level: Annotated[str, typer.Option(help="uvicorn/fp8rl log level.")] = "info",
) -> None:
    """Serve the REST API to start, watch and stop runs (docs at /docs)."""
    import uvicorn

    from fp8rl.services.api import ApiSettings, create_app
    from fp8rl.services.api.policy import SpecPolicy
    from fp8rl.services.api.settings import load_token
    from fp8rl.services.store import RunStore

    logging.basicConfig(
        level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    data_dir = data_dir.expanduser().resolve()
    try:
        token, token_source = load_token(token_file=token_file, data_dir=data_dir)
        settings = ApiSettings(
            data_dir=data_dir,
            db_url=db or f"sqlite:///{data_dir / 'runs.db'}",
            token=token,
            ray_address=ray_address or None,
            driver_entrypoint=driver_entrypoint,
            max_body_bytes=max_body_bytes,
            stop_timeout_s=stop_timeout,
            max_active_runs=max_active_runs,
            policy=SpecPolicy(
                allowed_paths=[p.expanduser().resolve() for p in allow_path or []],
                reward_modules=allow_reward_module or [],
                remote_reward_prefixes=allow_reward_url or [],
            ),
        )
        RunStore.open(settings.db_url, migrate=True).close()  # fail here, not inside uvicorn
    except (ValueError, OSError) as exc:
        raise fail(str(exc)) from None
    except Exception as exc:  # SQLAlchemy: missing driver, unreachable database, bad credentials
        raise fail(f"cannot open the run store: {type(exc).__name__}: {exc}") from None
    if not _is_loopback(host):
        typer.secho(
            f"warning: serving on {host}: anyone who can reach port {port} and holds the token "
            "can start jobs; put TLS in front of it",
            fg=typer.colors.YELLOW,
            err=True,
        )
    typer.echo(f"fp8rl API on http://{host}:{port}  (token from {token_source})", err=True)
    uvicorn.run(
        create_app(settings),
        host=host,
        port=port,
        log_level=log_level.lower(),
        timeout_graceful_shutdown=5,
        server_header=False,
    )


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def register(app: typer.Typer) -> None:
    """Add the command to the CLI."""
    app.command()(serve)
