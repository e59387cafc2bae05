"""Helpers shared by CLI commands: reading a spec and reporting user errors."""

from __future__ import annotations

import sys
from pathlib import Path

import typer

from fp8rl.protocol import JobSpec, SpecError, load_job_spec

EXIT_USER_ERROR = 2
"""Exit code for errors the user can fix (bad spec, missing file), like argparse's."""


def fail(message: str, code: int = EXIT_USER_ERROR) -> typer.Exit:
    """Print ``message`` to stderr and return the ``typer.Exit`` to raise."""
    typer.secho(message, fg=typer.colors.RED, err=True)
    return typer.Exit(code)


def read_spec(path: Path, overrides: list[str] | None) -> JobSpec:
    """Load a JobSpec or exit with code 2 and one line per problem."""
    try:
        return load_job_spec(path, overrides or [])
    except SpecError as exc:
        raise fail(str(exc)) from None


def stderr_is_tty() -> bool:
    """Whether progress bars make sense."""
    return sys.stderr.isatty()
