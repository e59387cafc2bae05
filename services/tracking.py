"""Experiment tracking: one ``Tracker`` fanning out to the backends of ``logging.backends``.

Backends (several at once): ``jsonl`` (always on; the run directory is the source of truth that
``fp8rl report`` reads), ``console`` (progress bar + one line per step + a heartbeat so the
console never sits silent while workers load or a step runs), ``tensorboard``, ``wandb``
(offline by default) and ``mlflow`` (a local file store in the run directory by default). The
last two are optional extras; asking for one that is not installed is a user error naming the
package, never a silent no-op.

Steps are numbered from 1 (the first step is step 1), as in ``fp8rl runs watch`` and the API.

Files in the run directory: ``metrics.jsonl`` (``{"step": s, ...}`` per step),
``generations.jsonl`` (training samples), ``validation.jsonl`` (validation samples),
``curves.jsonl`` (per-position curves such as ``mismatch_by_position``), ``run_info.json``
(host, hardware, library versions, one entry per start) and ``tracking.json`` (W&B / MLflow run
ids, so a resumed run keeps logging into the same run).

Resume: a Tracker started at ``start_step > 0`` (steps already done) first drops every JSONL
row with ``step > start_step`` (written by the interrupted attempt after its last checkpoint),
and TensorBoard purges those steps, so each step appears once.
"""

from __future__ import annotations

import json
import math
import os
import platform
import re
import socket
import sys
import threading
import time
from pathlib import Path
from typing import Any

from fp8rl.protocol import LoggingSpec

JSONL_FILES = ("metrics.jsonl", "generations.jsonl", "validation.jsonl", "curves.jsonl")
HEARTBEAT_S = 10.0
"""The console prints a 'still working' line when nothing was printed for this long."""


class Backend:
    """A tracking backend; every hook is optional (default: ignore)."""

    def log(self, step: int, metrics: dict[str, float]) -> None:
        """Scalar metrics of one step (non-finite values already replaced by None)."""

    def table(self, step: int, name: str, rows: list[dict[str, Any]]) -> None:
        """A table of rows (``generations`` or ``val_generations``) for one step."""

    def status(self, text: str) -> None:
        """What the run is doing now (console only)."""

    def close(self) -> None:
        """Flush and release resources."""


class Tracker:
    """Write metrics, sample tables and curves to every selected backend.

    Args:
        run_dir: the run directory. spec: ``job.logging``.
        config: the resolved JobSpec as a dict (logged as the run's config).
        total_steps: steps of the run (console progress bar). start_step: steps done before
            this attempt (> 0 when resuming; its first step is ``start_step + 1``).
            name: run name for W&B / MLflow.
    Raises:
        ValueError: ``wandb`` or ``mlflow`` is selected but the package is not installed.
    """

    def __init__(
        self,
        run_dir: Path,
        spec: LoggingSpec,
        *,
        config: dict[str, Any],
        total_steps: int | None = None,
        start_step: int = 0,
        name: str | None = None,
    ) -> None:
        self.run_dir, self.spec = run_dir, spec
        name = name or config.get("name") or run_dir.name
        write_run_info(run_dir, start_step=start_step)
        ids = _read_json(run_dir / "tracking.json")
        self.jsonl = JsonlBackend(run_dir, start_step=start_step)
        self.backends: list[Backend] = [self.jsonl]
        for backend in spec.backends:
            if backend == "console":
                self.backends.append(ConsoleBackend(total_steps, start_step=start_step))
            elif backend == "tensorboard":
                self.backends.append(TensorBoardBackend(run_dir, config, start_step=start_step))
            elif backend == "wandb":
                self.backends.append(WandbBackend(run_dir, spec, config, name, ids))
            elif backend == "mlflow":
                self.backends.append(MlflowBackend(run_dir, spec, config, name, ids))
        (run_dir / "tracking.json").write_text(json.dumps(ids, indent=2) + "\n")

    def log(self, step: int, metrics: dict[str, float]) -> None:
        """Record one step's scalar metrics (non-finite values are written as null)."""
        clean = {k: _finite(v) for k, v in metrics.items()}
        for backend in self.backends:
            backend.log(step, clean)

    def log_generations(self, step: int, rows: list[dict[str, Any]]) -> None:
        """Record sample responses (prompt, response, reward, …) of a training step as a table."""
        if rows:
            for backend in self.backends:
                backend.table(step, "generations", rows)

    def log_validation(
        self, step: int, metrics: dict[str, float], rows: list[dict[str, Any]]
    ) -> None:
        """Record validation metrics (``val/<set>/...``) and validation samples as a table."""
        self.log(step, metrics)
        if rows:
            for backend in self.backends:
                backend.table(step, "val_generations", rows)

    def log_curve(self, step: int, name: str, values: Any) -> None:
        """Record a per-position curve (e.g. mismatch by response position) to ``curves.jsonl``."""
        self.jsonl.curve(step, name, [float(v) for v in values])

    def status(self, text: str) -> None:
        """Say what the run is doing (shown on the console, repeated by the heartbeat)."""
        for backend in self.backends:
            backend.status(text)

    def close(self) -> None:
        """Flush and close every backend."""
        for backend in self.backends:
            backend.close()


# --------------------------------------------------------------------------------------------
# backends


class JsonlBackend(Backend):
    """The run directory's JSONL files (always on)."""

    def __init__(self, run_dir: Path, *, start_step: int) -> None:
        if start_step > 0:
            for name in JSONL_FILES:
                truncate_jsonl(run_dir / name, before_step=start_step + 1)
        self.files = {
            name: open(run_dir / name, "a", buffering=1)  # noqa: SIM115 (closed in close())
            for name in JSONL_FILES
        }

    def _write(self, name: str, record: dict[str, Any]) -> None:
        self.files[name].write(json.dumps(record, default=str) + "\n")

    def log(self, step: int, metrics: dict[str, float]) -> None:
        self._write("metrics.jsonl", {"step": step, **metrics})

    def table(self, step: int, name: str, rows: list[dict[str, Any]]) -> None:
        target = "validation.jsonl" if name == "val_generations" else "generations.jsonl"
        for row in rows:
            self._write(target, {"step": step, **row})

    def curve(self, step: int, name: str, values: list[float]) -> None:
        """One per-position curve."""
        self._write("curves.jsonl", {"step": step, "name": name, "values": values})

    def close(self) -> None:
        for f in self.files.values():
            f.close()


class ConsoleBackend(Backend):
    """Progress bar and step lines (``services.progress.StepProgress``) plus a heartbeat thread.

    Without a TTY the bar is off; the heartbeat then prints ``… <status> (N s)`` whenever nothing
    was printed for ``HEARTBEAT_S`` seconds (model loading, a long step), so logs never go quiet.
    """

    def __init__(self, total_steps: int | None, *, start_step: int) -> None:
        from fp8rl.services.progress import StepProgress

        self.total = total_steps
        self.progress = StepProgress(total_steps or 0)
        self.progress.bar.update(self.progress.task, completed=start_step)
        self.console = self.progress.console
        self.text, self.since, self.last_output = "starting", time.monotonic(), time.monotonic()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._heartbeat, name="fp8rl-heartbeat", daemon=True)
        self._thread.start()

    def _heartbeat(self) -> None:
        while not self._stop.wait(1.0):
            now = time.monotonic()
            if now - self.last_output >= HEARTBEAT_S:
                self.console.print(f"… {self.text} ({now - self.since:.0f} s)", highlight=False)
                self.last_output = now

    def status(self, text: str) -> None:
        self.text, self.since = text, time.monotonic()
        self.progress.bar.update(self.progress.task, description=text)
        self.console.print(text, highlight=False)
        self.last_output = time.monotonic()

    def log(self, step: int, metrics: dict[str, float]) -> None:
        numbers = {k: v for k, v in metrics.items() if v is not None}
        if any(not k.startswith("val/") for k in numbers):
            self.progress.update(step, numbers)
            more = self.total is None or step < self.total
            self.text = f"step {step + 1} running" if more else "finishing (final checkpoint)"
            self.since = time.monotonic()
        val = {k: v for k, v in numbers.items() if k.startswith("val/")}
        if val:
            shown = "  ".join(f"{k} {v:.4g}" for k, v in sorted(val.items()))
            self.console.print(f"validation after step {step}: {shown}", highlight=False)
        self.last_output = time.monotonic()

    def table(self, step: int, name: str, rows: list[dict[str, Any]]) -> None:
        if name != "val_generations":
            return  # training samples go to the files; the console shows validation only
        from rich.table import Table

        table = Table(title=f"validation samples (step {step})", show_lines=True)
        columns = list(rows[0])
        for column in columns:
            table.add_column(column, overflow="fold")
        for row in rows:
            table.add_row(*(str(row.get(c, "")) for c in columns))
        self.console.print(table)
        self.last_output = time.monotonic()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2)
        last = self.progress.history[-1] if self.progress.history else {}
        self.progress.close(last)


class TensorBoardBackend(Backend):
    """TensorBoard event files in ``<run_dir>/tensorboard`` (tables as Markdown text)."""

    def __init__(self, run_dir: Path, config: dict[str, Any], *, start_step: int) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(
            str(run_dir / "tensorboard"), purge_step=start_step + 1 if start_step > 0 else None
        )
        self.writer.add_text("config", f"```\n{json.dumps(config, indent=2)}\n```", start_step)

    def log(self, step: int, metrics: dict[str, float]) -> None:
        for key, value in metrics.items():
            if value is not None:
                self.writer.add_scalar(key, value, step)

    def table(self, step: int, name: str, rows: list[dict[str, Any]]) -> None:
        self.writer.add_text(name, markdown_table(rows), step)

    def close(self) -> None:
        self.writer.close()


class WandbBackend(Backend):
    """Weights & Biases (``logging.wandb``; offline mode writes ``<run_dir>/wandb``)."""

    def __init__(
        self,
        run_dir: Path,
        spec: LoggingSpec,
        config: dict[str, Any],
        name: str,
        ids: dict[str, str],
    ) -> None:
        wandb = _optional("wandb", "wandb")
        os.environ.setdefault("WANDB_SILENT", "true")
        self.wandb = wandb
        self.run = wandb.init(
            project=spec.wandb.project,
            mode=spec.wandb.mode,
            dir=str(run_dir),
            name=name,
            id=ids.get("wandb_run_id"),
            resume="allow",
            config=config,
        )
        ids["wandb_run_id"] = self.run.id

    def log(self, step: int, metrics: dict[str, float]) -> None:
        self.run.log({k: v for k, v in metrics.items() if v is not None}, step=step)

    def table(self, step: int, name: str, rows: list[dict[str, Any]]) -> None:
        columns = list(rows[0])
        data = [[_cell(row.get(c)) for c in columns] for row in rows]
        self.run.log({name: self.wandb.Table(columns=columns, data=data)}, step=step)

    def close(self) -> None:
        self.run.finish()


class MlflowBackend(Backend):
    """MLflow (``logging.mlflow``; default store ``file:<run_dir>/mlruns``).

    Metric names keep ``/`` but other characters MLflow refuses (``@`` in ``mean@4``) become
    ``_``. Tables are ``log_table`` JSON artifacts under ``tables/``.
    """

    def __init__(
        self,
        run_dir: Path,
        spec: LoggingSpec,
        config: dict[str, Any],
        name: str,
        ids: dict[str, str],
    ) -> None:
        mlflow = _optional("mlflow", "mlflow")
        uri = spec.mlflow.tracking_uri or f"file:{(run_dir / 'mlruns').resolve()}"
        if uri.startswith("file:"):  # MLflow >= 3.x refuses its file store unless opted in
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        self.mlflow = mlflow
        self.client = mlflow.MlflowClient(tracking_uri=uri)
        experiment = self.client.get_experiment_by_name(spec.mlflow.experiment)
        experiment_id = (
            experiment.experiment_id
            if experiment
            else self.client.create_experiment(spec.mlflow.experiment)
        )
        run_id = ids.get("mlflow_run_id")
        if run_id is None:
            run_id = self.client.create_run(experiment_id, run_name=name).info.run_id
            self.client.log_dict(run_id, config, "config.json")
            precision = config.get("precision", {})
            for key, value in {
                "model.path": config.get("model", {}).get("path"),
                "precision.mode": precision.get("mode"),
                "seed": config.get("seed"),
                "steps": config.get("steps"),
            }.items():
                self.client.log_param(run_id, key, str(value))
        self.run_id = ids["mlflow_run_id"] = run_id

    def log(self, step: int, metrics: dict[str, float]) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        batch = [
            Metric(mlflow_name(k), float(v), now, step) for k, v in metrics.items() if v is not None
        ]
        for start in range(0, len(batch), 1000):
            self.client.log_batch(self.run_id, metrics=batch[start : start + 1000])

    def table(self, step: int, name: str, rows: list[dict[str, Any]]) -> None:
        columns = {c: [_cell(row.get(c)) for row in rows] for c in rows[0]}
        self.client.log_table(self.run_id, columns, f"tables/{name}_step_{step}.json")

    def close(self) -> None:
        self.client.set_terminated(self.run_id)


# --------------------------------------------------------------------------------------------
# helpers


def truncate_jsonl(path: Path, *, before_step: int) -> int:
    """Keep only the rows of ``path`` with ``step < before_step`` (atomic rewrite).

    Returns the number of rows dropped. Unparsable lines (a torn last write) are dropped too.
    """
    if not path.exists():
        return 0
    kept, dropped = [], 0
    for line in path.read_text().splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            dropped += 1
            continue
        if int(row.get("step", -1)) < before_step:
            kept.append(line)
        else:
            dropped += 1
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text("".join(f"{line}\n" for line in kept))
    os.replace(tmp, path)
    return dropped


def markdown_table(rows: list[dict[str, Any]]) -> str:
    """Rows as a Markdown table (cells escaped, newlines as spaces)."""
    if not rows:
        return ""
    columns = list(rows[0])

    def cell(value: Any) -> str:
        return str(_cell(value)).replace("|", "\\|").replace("\n", " ")

    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(cell(r.get(c)) for c in columns) + " |" for r in rows]
    return "\n".join(lines)


def mlflow_name(key: str) -> str:
    """A metric name MLflow accepts: characters outside ``[A-Za-z0-9_\\-. :/]`` become ``_``."""
    return re.sub(r"[^A-Za-z0-9_\-. :/]", "_", key)


def hardware_info() -> dict[str, Any]:
    """Host, CPU, GPU and library versions of this process (for the run report)."""
    info: dict[str, Any] = {
        "hostname": socket.gethostname(),
        "platform": platform.platform(),
        "python": sys.version.split()[0],
        "cpu_count": os.cpu_count(),
    }
    try:
        import torch

        info["torch"] = torch.__version__
        info["cuda_available"] = torch.cuda.is_available()
        if torch.cuda.is_available():
            info["gpus"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    except ImportError:  # pragma: no cover - torch is a dependency
        pass
    for package in ("ray", "transformers", "vllm"):
        try:
            from importlib.metadata import version

            info[package] = version(package)
        except Exception:  # not installed
            continue
    return info


def write_run_info(run_dir: Path, *, start_step: int) -> None:
    """Add this start (time, first step, hardware) to ``run_info.json``."""
    path = run_dir / "run_info.json"
    info = _read_json(path) or {"starts": []}
    info["hardware"] = hardware_info()
    info["starts"].append({"time": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "start_step": start_step})
    path.write_text(json.dumps(info, indent=2) + "\n")


def _read_json(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return {}


def _finite(value: Any) -> float | int | None:
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, int | float) and math.isfinite(value):
        return value
    return None


def _cell(value: Any) -> Any:
    return value if isinstance(value, int | float | str | bool) or value is None else str(value)


def _optional(module: str, extra: str) -> Any:
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as error:
        raise ValueError(
            f"logging.backends includes {module!r} but the {module} package is not installed "
            f"(pip install 'fp8rl[{extra}]'), or remove {module!r} from logging.backends"
        ) from error
