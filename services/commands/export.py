"""``fp8rl export RUN_DIR [--step N] --format hf-bf16|hf-fp8 [--out DIR]``: a Hugging Face model."""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path
from typing import Annotated

import typer

from fp8rl.services.commands.common import fail


class Format(StrEnum):
    """Export formats (see ``fp8rl.services.export``)."""

    hf_bf16 = "hf-bf16"
    hf_fp8 = "hf-fp8"


def export(
    run_dir: Annotated[
        Path, typer.Argument(help="Run directory, its checkpoints/ or one step_<N> checkpoint.")
    ],
    format: Annotated[
        Format, typer.Option("--format", "-f", help="hf-bf16: BF16 weights; hf-fp8: block FP8.")
    ] = Format.hf_bf16,
    step: Annotated[
        int | None, typer.Option(help="Export this step's checkpoint (default: latest).")
    ] = None,
    out: Annotated[
        Path | None,
        typer.Option(
            help="Target directory (default RUN_DIR/exports/FORMAT-step_N). A previous export "
            "there is replaced; any other non-empty directory is refused."
        ),
    ] = None,
) -> None:
    """Export a checkpoint as a Hugging Face model directory.

    It holds the config, tokenizer, chat template and safetensors weights; hf-fp8 keeps the
    E4M3 codes and 128x128 scales the rollout engines ran.

    Exit code 2 for a problem with the checkpoint (none there, no such step, an incomplete or
    damaged save: the message names the file; pick another --step or restore it), 1 when
    writing the export fails.
    """
    import logging

    from fp8rl.services.checkpoint import CheckpointCorruptError, CheckpointError
    from fp8rl.services.export import export_checkpoint

    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    try:
        path = export_checkpoint(run_dir, fmt=format.value, out=out, step=step)
    except (CheckpointError, CheckpointCorruptError, FileNotFoundError, ValueError) as error:
        raise fail(f"export failed: {error}") from None
    except OSError as error:  # the export's own files (disk full, permissions)
        raise fail(f"export failed: {error}", code=1) from None
    typer.echo(str(path))


def register(app: typer.Typer) -> None:
    """Add the command to the CLI."""
    app.command()(export)
