"""``--help`` reads well at 80 columns: no line of a command's description or of a command list
ends early when the next word would have fitted (``fp8rl export --help`` used to print "an" alone
on a line, ``fp8rl --help`` broke validate's summary after "reward")."""

from __future__ import annotations

from itertools import pairwise

import pytest
from typer.testing import CliRunner

from fp8rl.services.cli import app

WIDTH = 80
COMMANDS = [
    [],
    ["export"],
    ["mismatch"],
    ["runs"],
    ["runs", "submit"],
    ["runs", "watch"],
    ["serve"],
    ["submit"],
    ["validate"],
    ["report"],
    ["run"],
]


def _early_breaks(text: str) -> list[str]:
    """Lines of the description (above the first panel) or of a command list whose paragraph
    goes on below although the next word would have fitted on them."""
    lines = text.splitlines()
    top = next((i for i, line in enumerate(lines) if line.startswith("╭")), len(lines))
    found = [
        line.strip()
        for line, below in pairwise(lines[:top])
        if line.strip() and below.strip() and _fits(line.rstrip(), below, WIDTH - 2)
    ]
    in_commands = False
    for line, below in pairwise(lines):
        in_commands = line.startswith("╭─ Commands") or (in_commands and line.startswith("│"))
        if not in_commands or line.startswith("╭") or not below.startswith("│"):
            continue
        text, cont = line.strip("│").rstrip(), below.strip("│")
        continues = cont.strip() and len(cont) - len(cont.lstrip()) > 1  # no command name
        if continues and _fits(text, cont, WIDTH - 4):
            found.append(text.strip())
    return found


def _fits(line: str, below: str, width: int) -> bool:
    """Whether the first word of ``below`` would have fitted at the end of ``line``."""
    return len(line) + 1 + len(below.split()[0]) < width


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: " ".join(c) or "fp8rl")
def test_help_at_80_columns_breaks_lines_only_where_they_are_full(command):
    result = CliRunner().invoke(app, [*command, "--help"], env={"COLUMNS": str(WIDTH)})
    assert result.exit_code == 0, result.output
    assert max(len(line) for line in result.output.splitlines()) <= WIDTH
    assert _early_breaks(result.output) == []
