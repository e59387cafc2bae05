"""The run directory ``<output_dir>/<name>``: resolved spec, metrics, checkpoints, exports."""

from __future__ import annotations

import logging
import time
from pathlib import Path

import yaml

from fp8rl.protocol import JobSpec

log = logging.getLogger(__name__)


def run_dir_of(job: JobSpec) -> Path:
    """``output_dir/name`` (relative paths are relative to the working directory)."""
    return Path(job.output_dir).expanduser() / job.name


def prepare_run_dir(job: JobSpec, *, fresh: bool) -> Path:
    """Create the run directory and write the resolved spec (``job.yaml``) and its fingerprint.

    ``fresh`` (not resuming): a directory left by an earlier attempt is moved aside to
    ``<name>.previous-<time>`` first, so a new run never appends to an old run's metrics.
    """
    path = run_dir_of(job)
    if fresh and path.exists() and any(path.iterdir()):
        aside = path.with_name(f"{path.name}.previous-{time.strftime('%Y%m%d-%H%M%S')}")
        path.rename(aside)
        log.warning("%s held an earlier run: moved it to %s", path, aside)
    path.mkdir(parents=True, exist_ok=True)
    (path / "job.yaml").write_text(yaml.safe_dump(job.model_dump(mode="json"), sort_keys=False))
    (path / "quant_fingerprint").write_text(job.precision.quant.fingerprint() + "\n")
    return path
