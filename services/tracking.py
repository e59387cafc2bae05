"""Experiment tracking: JSONL (always) and TensorBoard metrics in the run directory.

``metrics.jsonl`` holds one JSON object per step (``{"step": s, ...metrics}``);
``generations.jsonl`` the logged sample responses; ``tensorboard/`` the event files.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from fp8rl.protocol import LoggingSpec


class Tracker:
    """Write step metrics to the backends selected in ``LoggingSpec`` (JSONL is always on)."""

    def __init__(self, run_dir: Path, spec: LoggingSpec, *, config: dict[str, Any]) -> None:
        self.run_dir, self.spec = run_dir, spec
        self.metrics_file = open(run_dir / "metrics.jsonl", "a", buffering=1)  # noqa: SIM115
        self.generations_file = open(run_dir / "generations.jsonl", "a", buffering=1)  # noqa: SIM115
        self.tb = None
        if "tensorboard" in spec.backends:
            from torch.utils.tensorboard import SummaryWriter

            self.tb = SummaryWriter(str(run_dir / "tensorboard"))
            self.tb.add_text("config", f"```\n{json.dumps(config, indent=2)}\n```", 0)

    def log(self, step: int, metrics: dict[str, float]) -> None:
        """Record one step's scalar metrics (non-finite values are written as null)."""
        clean = {
            k: (v if isinstance(v, int | float) and math.isfinite(v) else None)
            for k, v in metrics.items()
        }
        self.metrics_file.write(json.dumps({"step": step, **clean}) + "\n")
        if self.tb is not None:
            for key, value in clean.items():
                if value is not None:
                    self.tb.add_scalar(key, value, step)

    def log_generations(self, step: int, rows: list[dict[str, Any]]) -> None:
        """Record sample responses (prompt, response, reward, …) for this step."""
        for row in rows:
            self.generations_file.write(json.dumps({"step": step, **row}) + "\n")
        if self.tb is not None and rows:
            table = "\n\n".join(
                f"**reward {r.get('reward')}**: {r.get('response', '')!r}" for r in rows
            )
            self.tb.add_text("generations", table, step)

    def log_curve(self, step: int, name: str, values: Any) -> None:
        """Record a per-position curve (e.g. mismatch by response position) to ``curves.jsonl``."""
        with open(self.run_dir / "curves.jsonl", "a") as f:
            f.write(
                json.dumps({"step": step, "name": name, "values": [float(v) for v in values]})
                + "\n"
            )

    def close(self) -> None:
        """Flush and close every backend."""
        self.metrics_file.close()
        self.generations_file.close()
        if self.tb is not None:
            self.tb.close()
