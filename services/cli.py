"""The ``fp8rl`` command line. Each command lives in ``fp8rl.services.commands.<name>``.

Commands import torch/ray lazily, so ``fp8rl --help`` and ``fp8rl validate`` stay fast. Errors a
user can fix (a bad spec, a missing file) print one readable message and exit with code 2.
"""

from __future__ import annotations

import inspect

import typer

from fp8rl.services.commands import export, mismatch, report, run, runs, serve, submit, validate

app = typer.Typer(
    name="fp8rl",
    help="On-policy RL for LLMs in FP8: one precision flow for rollout and trainer.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


@app.callback()
def _root() -> None:
    """On-policy RL for LLMs in FP8: one precision flow for rollout and trainer."""


validate.register(app)
run.register(app)
submit.register(app)
mismatch.register(app)
serve.register(app)
runs.register(app)
export.register(app)
report.register(app)


def _unwrap_help(typer_app: typer.Typer) -> None:
    """Join the hard line breaks inside each paragraph of every command's help (docstrings are
    wrapped at 100 columns; typer's rich help keeps single newlines, so ``--help`` and the
    command list would break lines mid-sentence). Paragraphs starting with ``\\b`` stay as
    written, as in click."""
    for info in typer_app.registered_commands:
        text = inspect.cleandoc(info.help or inspect.getdoc(info.callback) or "")
        info.help = "\n\n".join(
            part if part.startswith("\b") else " ".join(part.split()) for part in text.split("\n\n")
        )
    for group in typer_app.registered_groups:
        _unwrap_help(group.typer_instance)


_unwrap_help(app)


def main() -> None:
    """Console-script entry point."""
    app()


if __name__ == "__main__":
    main()
