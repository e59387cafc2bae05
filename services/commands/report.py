"""``fp8rl report RUN_DIR [--out DIR]``: PNG plots and a Markdown/HTML summary of a run."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from fp8rl.services.commands.common import fail


def report(
    run_dir: Annotated[Path, typer.Argument(help="Run directory (output_dir/name).")],
    out: Annotated[
        Path | None, typer.Option(help="Where to write the report (default RUN_DIR/report).")
    ] = None,
) -> None:
    """Write a run's report.md and a self-contained report.html.

    Plots reward, validation accuracy, response length, mismatch (over steps and positions),
    time per phase and tokens/s. Exit code 2 when RUN_DIR is not a run with a finished step, 1
    when the report cannot be written to --out.
    """
    from fp8rl.services.report import ReportTargetError, write_report

    try:
        path = write_report(run_dir, out=out)
    except ReportTargetError as error:  # where it writes: exit 1, as `export` does
        raise fail(f"report failed: {error}", code=1) from None
    except FileNotFoundError as error:  # the run: exit 2
        raise fail(f"report failed: {error}") from None
    except OSError as error:  # writing a plot or page (disk full, permissions)
        raise fail(f"report failed: {error}", code=1) from None
    typer.echo(f"{path / 'report.html'}")


def register(app: typer.Typer) -> None:
    """Add the command to the CLI."""
    app.command()(report)
