"""``fp8rl validate SPEC [k=v …]``: print the resolved spec and its quant fingerprint."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
import yaml

from fp8rl.protocol import JobSpec, SpecError
from fp8rl.protocol.loading import blame_overrides
from fp8rl.services.commands.common import fail, read_spec
from fp8rl.services.preflight import preflight
from fp8rl.services.spec_warnings import spec_warnings


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
    plan: Annotated[
        bool,
        typer.Option(
            "--plan",
            help="Print which actor lands on which GPU and the estimated memory of each GPU "
            "against resources.gpus_per_node × num_nodes and resources.gpu_memory_gib "
            "(exit 2 when it does not fit).",
        ),
    ] = False,
) -> None:
    """Validate a job spec and print it fully resolved.

    Checks the fields and what this machine needs to run it (files, datasets, extras, reward
    functions), then prints the resolved spec and its quant fingerprint, or with --plan its
    placement.
    """
    job = read_spec(spec, overrides)
    if plan:
        from fp8rl.services.commands.plan_view import print_plan
        from fp8rl.services.placement import plan_placement

        print_plan(plan_placement(job, read_config=local))
    for warning in spec_warnings(job):
        typer.secho(f"warning: {warning}", fg=typer.colors.YELLOW, err=True)
    try:
        preflight(job, local=local)
    except SpecError as exc:
        lines = blame_overrides(exc.problems, overrides or [])
        message = f"{spec} cannot run:\n" + "\n".join(f"  {line}" for line in lines)
        raise fail(message + _advice(job, local=local)) from None
    if plan:
        _echo_megatron_layout(job)
        typer.echo("# the plan fits")
        return
    typer.echo(yaml.safe_dump(job.model_dump(mode="json"), sort_keys=False).rstrip())
    typer.echo(f"# precision.mode: {job.precision.mode}  exact: {job.precision.exact}")
    typer.echo(f"# quant fingerprint: {job.precision.quant.fingerprint()}")
    _echo_megatron_layout(job)


def _echo_megatron_layout(job) -> None:
    """``trainer.backend=megatron``: the TP × PP × DP split of the trainer actors (one line)."""
    if job.trainer.backend == "megatron":
        from fp8rl.workers.trainer.megatron.layout import ParallelLayout

        t = job.trainer
        layout = ParallelLayout.from_world(
            t.num_workers, tp=t.tensor_parallel_size, pp=t.pipeline_parallel_size
        )
        typer.echo(f"# megatron trainer: {layout.describe()}")


def _advice(job: JobSpec, *, local: bool) -> str:
    """Single changes that make the placement fit (``services.plan_advice``), as text lines."""
    from fp8rl.services.placement import plan_placement
    from fp8rl.services.plan_advice import advise

    lines = advise(job, planner=lambda j: plan_placement(j, read_config=local))
    if not lines:
        return ""
    return "".join(["\nchanges that help (one at a time):", *(f"\n  {a}" for a in lines)])


def register(app: typer.Typer) -> None:
    """Add the command to the CLI."""
    app.command()(validate)
