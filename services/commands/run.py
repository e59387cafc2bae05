"""``fp8rl run SPEC [k=v …]``: run a job locally (attaching to a reachable Ray, else starting one)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer


def run(
    spec: Annotated[Path, typer.Argument(help="YAML job spec.")],
    overrides: Annotated[
        list[str] | None, typer.Argument(help="Dotted overrides, e.g. steps=2 rollout.n=4.")
    ] = None,
) -> None:
    """Run the RL loop of a job spec to the end: the same driver as `ray job submit` and the API."""
    from fp8rl.services.driver import main

    code = main([str(spec), *(overrides or [])])
    raise typer.Exit(code)


def register(app: typer.Typer) -> None:
    """Add the command to the CLI."""
    app.command()(run)
