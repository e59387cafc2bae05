"""``fp8rl validate SPEC [k=v …]``: print the resolved spec and its quant fingerprint."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
import yaml

from fp8rl.services.commands.common import read_spec


def validate(
    spec: Annotated[Path, typer.Argument(help="YAML job spec.")],
    overrides: Annotated[
        list[str] | None, typer.Argument(help="Dotted overrides, e.g. rollout.max_tokens=512.")
    ] = None,
) -> None:
    """Validate a job spec; print it fully resolved (defaults filled in) and its quant fingerprint."""
    job = read_spec(spec, overrides)
    typer.echo(yaml.safe_dump(job.model_dump(mode="json"), sort_keys=False).rstrip())
    typer.echo(f"# precision.mode: {job.precision.mode}  exact: {job.precision.exact}")
    typer.echo(f"# quant fingerprint: {job.precision.quant.fingerprint()}")


def register(app: typer.Typer) -> None:
    """Add the command to the CLI."""
    app.command()(validate)
