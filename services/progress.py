"""Console progress for a run: one bar over steps showing reward, length, mismatch; a summary table."""

from __future__ import annotations

import sys

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

SUMMARY_KEYS = (
    "reward/mean",
    "response_length/mean",
    "mismatch/token_mult_prob_error",
    "mismatch/abs_dlogp_max",
    "mismatch/kl_k3",
    "actor/pg_loss",
    "actor/kl",
    "actor/entropy",
    "actor/grad_norm",
    "timing_s/rollout",
    "timing_s/train",
    "timing_s/sync",
    "timing_s/step",
    "perf/tokens_per_s",
)


class StepProgress:
    """A rich progress bar over ``total`` steps; each step also prints one log line (non-TTY safe)."""

    def __init__(self, total: int) -> None:
        self.console = Console(stderr=True)
        self.bar = Progress(
            TextColumn("[bold]step"),
            MofNCompleteColumn(),
            BarColumn(),
            TimeElapsedColumn(),
            TextColumn("{task.description}"),
            console=self.console,
            disable=not sys.stderr.isatty(),
        )
        self.task = self.bar.add_task("starting", total=total)
        self.bar.start()
        self.history: list[dict[str, float]] = []

    def update(self, step: int, metrics: dict[str, float]) -> None:
        """Advance the bar and print the step's key numbers."""
        self.history.append(metrics)
        line = (
            f"reward {metrics.get('reward/mean', float('nan')):.3f}  "
            f"len {metrics.get('response_length/mean', float('nan')):.1f}  "
            f"mult_prob_err {metrics.get('mismatch/token_mult_prob_error', float('nan')):.6f}  "
            f"|Δlogp|max {metrics.get('mismatch/abs_dlogp_max', float('nan')):.3g}  "
            f"step {metrics.get('timing_s/step', 0):.1f}s"
        )
        self.bar.update(self.task, advance=1, description=line)
        timing = "  ".join(
            f"{k.split('/')[1]} {v:.1f}s"
            for k, v in metrics.items()
            if k.startswith("timing_s/") and k.count("/") == 1 and k != "timing_s/step"
        )
        self.console.print(f"step {step}: {line}  [{timing}]", highlight=False)

    def close(self, last: dict[str, float]) -> None:
        """Stop the bar and print a summary table (first and last step)."""
        self.bar.stop()
        if not self.history:
            return
        table = Table(title="run summary")
        table.add_column("metric")
        table.add_column("first step", justify="right")
        table.add_column("last step", justify="right")
        first = self.history[0]
        for key in SUMMARY_KEYS:
            if key in last:
                table.add_row(key, f"{first.get(key, float('nan')):.6g}", f"{last[key]:.6g}")
        self.console.print(table)
