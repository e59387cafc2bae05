"""The run directory ``<output_dir>/<name>``: resolved spec, metrics, checkpoints, exports."""

from __future__ import annotations

import fcntl
import logging
import os
import re
import shutil
import time
from pathlib import Path

import yaml

from fp8rl.protocol import JobSpec
from fp8rl.services.checkpoint_manifest import CHECKPOINTS, checkpoint_steps

log = logging.getLogger(__name__)

_HELD: dict[Path, int] = {}
"""Run locks this process holds (file descriptors stay open until the process ends)."""


class RunDirectoryBusy(ValueError):
    """Another live process runs a job with this run directory."""


def lock_run_dir(job: JobSpec) -> Path:
    """Take ``<output_dir>/.<name>.lock`` for this process's lifetime (``flock``; released by
    the OS when the process ends, also on kill -9). Idempotent within a process.

    Raises:
        RunDirectoryBusy: another process holds it (a run of the same ``name`` is live), naming
            its pid: moving its directory aside would crash it.
    """
    path = run_dir_of(job)
    lock = path.with_name(f".{path.name}.lock")
    if lock in _HELD:
        return lock
    lock.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
        os.close(fd)
        raise RunDirectoryBusy(
            f"name: a run named {job.name!r} is already running in {path} (pid {holder}); "
            "wait for it, stop it, or pick another name=..."
        ) from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    _HELD[lock] = fd
    return lock


def run_dir_of(job: JobSpec) -> Path:
    """``output_dir/name`` (relative paths are relative to the working directory)."""
    return Path(job.output_dir).expanduser() / job.name


def prepare_run_dir(job: JobSpec, *, fresh: bool) -> Path:
    """Create the run directory and write the resolved spec (``job.yaml``) and its fingerprint.

    ``fresh`` (not resuming): a directory left by an earlier attempt is moved aside to
    ``<name>.previous-<time>`` first, so a new run never appends to an old run's metrics; only
    the newest ``job.keep_previous_runs`` of those are kept. A failed start (``failed_start``:
    no step completed, no checkpoint) is removed instead of moved aside, so failed attempts never
    push a run that did something out of ``keep_previous_runs``.
    """
    path = run_dir_of(job)
    if fresh and path.exists() and any(path.iterdir()):
        if failed_start(path):
            shutil.rmtree(path)
            log.warning(
                "%s held a failed start (no step completed, no checkpoint): removed it "
                "instead of moving it aside",
                path,
            )
        else:
            aside = _move_aside(path)
            log.warning("%s held an earlier run: moved it to %s", path, aside)
            prune_previous_runs(path, keep=job.keep_previous_runs)
    path.mkdir(parents=True, exist_ok=True)
    (path / "job.yaml").write_text(yaml.safe_dump(job.model_dump(mode="json"), sort_keys=False))
    (path / "quant_fingerprint").write_text(job.precision.quant.fingerprint() + "\n")
    return path


_ASIDE = re.compile(r"previous-\d{8}-\d{6}(-\d+)?")
"""The suffix ``_move_aside`` gives (``previous-YYYYmmdd-HHMMSS``, ``-<ns>`` on a clash): only
such directories are pruned, never another run whose name merely starts the same way."""


def _move_aside(path: Path) -> Path:
    """Rename ``path`` to ``<name>.previous-<time>``; return the new path."""
    aside = path.with_name(f"{path.name}.previous-{time.strftime('%Y%m%d-%H%M%S')}")
    if aside.exists():  # two fresh starts within one second
        aside = aside.with_name(f"{aside.name}-{time.time_ns() % 10**9}")
    path.rename(aside)
    return aside


def failed_start(path: Path) -> bool:
    """Whether run directory ``path`` holds nothing of value: fp8rl wrote it (it has
    ``job.yaml``) but no step completed (no row in ``metrics.jsonl``) and no checkpoint was
    saved (no ``checkpoints/step_<N>``). A directory without ``job.yaml`` is not a failed start:
    it may hold someone's files."""
    if not (path / "job.yaml").is_file() or checkpoint_steps(path / CHECKPOINTS):
        return False
    metrics = path / "metrics.jsonl"
    if not metrics.is_file():
        return True
    with metrics.open("rb") as rows:
        return not any(row.strip() for row in rows)


def prune_previous_runs(path: Path, *, keep: int) -> list[Path]:
    """Delete all but the newest ``keep`` directories ``<path>.previous-*`` that did something,
    and every failed start among them (``failed_start``); return the deleted.

    ``keep`` counts only runs that completed a step or saved a checkpoint, so failed attempts
    never delete a good run. Only names ``_move_aside`` gives count (``_ASIDE``). Newest by the
    time in the name (``previous-YYYYmmdd-HHMMSS`` sorts by time). Logs each deletion with its size.
    """
    suffix = len(path.name) + 1
    previous = sorted(
        (
            p
            for p in path.parent.glob(f"{path.name}.previous-*")
            if p.is_dir() and _ASIDE.fullmatch(p.name[suffix:])
        ),
        reverse=True,
    )
    failed = [p for p in previous if failed_start(p)]
    removed = failed + [p for p in previous if p not in failed][keep:]
    for old in removed:
        size = sum(f.stat().st_size for f in old.rglob("*") if f.is_file())
        shutil.rmtree(old)
        why = "a failed start" if old in failed else f"keep_previous_runs={keep}"
        log.warning("deleted %s (%.1f MB; %s)", old, size / 2**20, why)
    return removed
