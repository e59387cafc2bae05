"""The run directory ``<output_dir>/<name>``: resolved spec, metrics, checkpoints, exports."""

from __future__ import annotations

from pathlib import Path

import yaml

from fp8rl.protocol import JobSpec


def run_dir_of(job: JobSpec) -> Path:
    """``output_dir/name`` (relative paths are relative to the working directory)."""
    return Path(job.output_dir).expanduser() / job.name


def prepare_run_dir(job: JobSpec) -> Path:
    """Create the run directory and write the resolved spec (``job.yaml``) and its fingerprint."""
    path = run_dir_of(job)
    path.mkdir(parents=True, exist_ok=True)
    (path / "job.yaml").write_text(yaml.safe_dump(job.model_dump(mode="json"), sort_keys=False))
    (path / "quant_fingerprint").write_text(job.precision.quant.fingerprint() + "\n")
    return path
