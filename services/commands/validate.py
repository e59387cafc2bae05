"""``fp8rl validate SPEC [k=v …]``: print the resolved spec and its quant fingerprint."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
import yaml

from fp8rl.protocol import SpecError
from fp8rl.services.commands.common import fail, read_spec
from fp8rl.services.preflight import preflight


def validate(
    spec: Annotated[Path, typer.Argument(help="YAML job spec.")],
    overrides: Annotated[
        list[str] | None, typer.Argument(help="Dotted overrides, e.g. rollout.max_tokens=512.")
    ] = None,
    local: Annotated[
        bool,
        typer.Option(
            help="Also check what this machine needs to run it: files, extras, reward "
            "functions (--no-local for a spec meant for a cluster)."
        ),
    ] = True,
) -> None:
    """Validate a job spec (fields, and what this machine needs to run it: files, extras, reward
    functions); print it fully resolved and its quant fingerprint."""
    job = read_spec(spec, overrides)
    try:
        preflight(job, local=local)
    except SpecError as exc:
        raise fail(str(exc).replace("invalid job spec", f"{spec} cannot run", 1)) from None
    typer.echo(yaml.safe_dump(job.model_dump(mode="json"), sort_keys=False).rstrip())
    typer.echo(f"# precision.mode: {job.precision.mode}  exact: {job.precision.exact}")
    typer.echo(f"# quant fingerprint: {job.precision.quant.fingerprint()}")
    if job.trainer.backend == "megatron":
        from fp8rl.workers.trainer.megatron.layout import ParallelLayout

        t = job.trainer
        layout = ParallelLayout.from_world(
            t.num_workers, tp=t.tensor_parallel_size, pp=t.pipeline_parallel_size
        )
        typer.echo(f"# megatron trainer: {layout.describe()}")


def register(app: typer.Typer) -> None:
    """Add the command to the CLI."""
    app.command()(validate)
