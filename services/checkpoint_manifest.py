"""The checkpoint manifest (``meta.json``) and the choice of checkpoints to resume from and prune.

A checkpoint directory is usable when its manifest parses, names the directory's step, and every
file it records has the recorded size and sha256 (``checkpoint_verify``). The resume point is the
newest usable checkpoint marked healthy; pruning keeps it whatever ``keep_last`` says; a resume
is refused under another quant contract (``check_compatible``). Layout and the write recipe:
``fp8rl.services.checkpoint``.
"""

from __future__ import annotations

import json
import logging
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import Field, ValidationError

from fp8rl.protocol import JobSpec, QuantConfig
from fp8rl.protocol.base import StrictModel
from fp8rl.services.checkpoint_verify import CheckpointCorruptError, FileRecord, verify_files

log = logging.getLogger("fp8rl.services.checkpoint")

FORMAT_VERSION = 2
"""``meta.json`` layout read and written (1 recorded sizes only and is no longer resumed from)."""
CHECKPOINTS = "checkpoints"
LATEST = "latest"
META = "meta.json"


class CheckpointError(ValueError):
    """A checkpoint the user pointed at that does not exist, or one from an incompatible spec.

    Data that is missing, unreadable or fails its checksums raises ``CheckpointCorruptError``
    (an ``OSError``: a storage fault, not a user error) instead.
    """


class CheckpointMeta(StrictModel):
    """``meta.json``: what a checkpoint holds and under which contract it was written."""

    format_version: int = FORMAT_VERSION
    """Layout version of the checkpoint directory (2: a sha256 per file)."""

    step: int = Field(ge=0)
    """RL steps completed; the resumed run's first step index."""

    healthy: bool = True
    """False when written after the run's last healthy step (a collapse or a failed guard): such
    a checkpoint is kept for inspection but never becomes the resume point."""

    policy_version: int = Field(ge=0)
    """Trainer optimizer steps taken (the WeightUpdate version of these weights)."""

    quant_fingerprint: str
    """``precision.quant.fingerprint()`` of the run that wrote it."""

    quant: QuantConfig
    """The QuantConfig itself (to name differing fields on refusal)."""

    precision_mode: str
    """``precision.mode`` of the run that wrote it."""

    model_path: str
    """``model.path`` of the run (the initial weights and reference policy)."""

    decoder_config: dict[str, Any]
    """``DecoderConfig.to_dict()`` of the architecture (exports rebuild config.json from it)."""

    master_dtype: str
    """Dtype of the saved master weights (``float32`` or ``bfloat16``)."""

    data_cursor: dict[str, Any]
    """``PromptSampler.state_dict()`` after step ``step``."""

    job: dict[str, Any]
    """The resolved JobSpec (``model_dump(mode="json")``)."""

    files: dict[str, FileRecord]
    """Relative path → size and sha256 of every other file of the checkpoint (whoever wrote it),
    recorded after all writers finished."""

    created_at: str
    """UTC time the save finished (ISO 8601)."""

    save_seconds: float = 0.0
    """Wall time of the save (hashing included)."""


@dataclass(frozen=True)
class Skipped:
    """A checkpoint passed over when choosing the resume point, and why."""

    path: Path
    reason: str
    corrupt: bool
    """True: failed verification (a storage fault); False: intact but not healthy."""


def read_meta(path: Path) -> CheckpointMeta:
    """The manifest of the checkpoint directory ``path`` (no file checks).

    Raises:
        CheckpointCorruptError: ``meta.json`` missing (an interrupted or damaged save),
            unreadable, not JSON, of another format version, or invalid (names the file).
    """
    meta_path = path / META
    try:
        raw = meta_path.read_bytes()
    except FileNotFoundError:
        raise CheckpointCorruptError(
            f"{path}: {META} is missing (an interrupted or damaged save)"
        ) from None
    except OSError as error:
        raise CheckpointCorruptError(
            f"{meta_path}: cannot read: {error.strerror or error}"
        ) from error
    try:
        data = json.loads(raw)
    except ValueError as error:  # UnicodeDecodeError and JSONDecodeError
        raise CheckpointCorruptError(f"{meta_path} is not valid JSON: {error}") from None
    version = data.get("format_version") if isinstance(data, dict) else None
    if version != FORMAT_VERSION:
        raise CheckpointCorruptError(
            f"{meta_path}: format_version {version!r}, this fp8rl reads {FORMAT_VERSION} "
            "(a manifest with a sha256 per file)"
        )
    try:
        return CheckpointMeta.model_validate(data)
    except ValidationError as error:
        first = error.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise CheckpointCorruptError(f"{meta_path} is invalid: {where}: {first['msg']}") from None


def verify_checkpoint(path: Path, *, checksums: bool = True) -> CheckpointMeta:
    """The manifest of ``path`` after checking every file it records.

    ``checksums=False``: sizes only (a quick completeness check for listings and pruning).

    Raises:
        CheckpointCorruptError: the manifest is missing or unreadable, names another step than
            the directory, or a file is missing, of another size, unreadable or fails its sha256
            (the message names the file).
    """
    meta = read_meta(path)
    if step_of(path) not in (None, meta.step):
        raise CheckpointCorruptError(f"{path}: {META} records step {meta.step}")
    verify_files(path, meta.files, checksums=checksums)
    return meta


def checkpoint_steps(root: Path) -> list[int]:
    """Steps of the ``step_<N>`` directories under ``root`` (complete or not), ascending."""
    if not root.is_dir():
        return []
    return sorted(s for p in root.iterdir() if p.is_dir() and (s := step_of(p)) is not None)


def select_checkpoint(root: Path, *, checksums: bool = True) -> tuple[Path | None, list[Skipped]]:
    """The resume point under ``root``: the newest checkpoint that verifies and is healthy.

    Newer ones passed over are returned as ``Skipped`` (path + reason), newest first. The
    ``latest`` pointer is not trusted for this: every candidate is verified.
    Returns ``(None, skipped)`` when no checkpoint qualifies.
    """
    skipped: list[Skipped] = []
    for step in reversed(checkpoint_steps(root)):
        path = root / f"step_{step}"
        try:
            meta = verify_checkpoint(path, checksums=checksums)
        except CheckpointCorruptError as error:
            skipped.append(Skipped(path, str(error).removeprefix(f"{path}: "), corrupt=True))
            continue
        if not meta.healthy:
            reason = "healthy: false (written after the run's last healthy step)"
            skipped.append(Skipped(path, reason, corrupt=False))
            continue
        return path, skipped
    return None, skipped


def latest_checkpoint(root: Path, *, checksums: bool = True) -> Path | None:
    """The newest verified, healthy checkpoint under ``root`` (None when there is none)."""
    return select_checkpoint(root, checksums=checksums)[0]


def warn_skipped(skipped: list[Skipped]) -> None:
    """Log each checkpoint passed over with its path and reason."""
    for s in skipped:
        log.warning("skipping checkpoint %s: %s", s.path, s.reason)


def prune_checkpoints(root: Path, *, keep_last: int, anchor: Path | None) -> list[Path]:
    """Delete complete checkpoints beyond the newest ``keep_last``, never ``anchor``.

    Args:
        keep_last: complete checkpoints kept (healthy or not); ones failing the quick check
            (manifest + sizes) do not count, so a damaged newer one never pushes a good one out.
        anchor: the newest verified, healthy checkpoint (the resume point): never deleted.
            Damaged checkpoints older than it can never be resumed from and are deleted; damaged
            newer ones stay for inspection (the run overwrites them when it gets there again).
    Returns the deleted paths.
    """
    anchor_step = step_of(anchor) if anchor is not None and anchor.parent == root else None
    complete, damaged = [], []
    for step in checkpoint_steps(root):
        try:
            verify_checkpoint(root / f"step_{step}", checksums=False)
            complete.append(step)
        except CheckpointCorruptError:
            damaged.append(step)
    keep = set(complete[-keep_last:]) | {anchor_step}
    doomed = [s for s in complete if s not in keep]
    if anchor_step is not None:
        doomed += [s for s in damaged if s < anchor_step]
    deleted = []
    for step in sorted(doomed):
        path = root / f"step_{step}"
        shutil.rmtree(path, ignore_errors=True)
        deleted.append(path)
    return deleted


def check_compatible(meta: CheckpointMeta, job: JobSpec, *, path: Path) -> None:
    """Refuse a checkpoint written under another quant contract (unless the spec allows it).

    Raises:
        CheckpointError: fingerprints or precision modes differ and
            ``checkpoint.allow_quant_change`` is false; the message names both fingerprints and
            the differing QuantConfig fields.
    """
    mine = job.precision.quant.fingerprint()
    problems = []
    if meta.quant_fingerprint != mine:
        fields = ", ".join(meta.quant.differing_fields(job.precision.quant)) or "unknown"
        problems.append(
            f"quant fingerprint {meta.quant_fingerprint} (checkpoint) != {mine} (this spec); "
            f"differing precision.quant fields: {fields}"
        )
    if meta.precision_mode != job.precision.mode:
        problems.append(
            f"precision.mode {meta.precision_mode} (checkpoint) != {job.precision.mode} (this spec)"
        )
    if not problems:
        return
    if job.checkpoint.allow_quant_change:
        log.warning("resuming %s under a changed quant contract: %s", path, "; ".join(problems))
        return
    raise CheckpointError(
        f"checkpoint {path} was written under another quant contract: "
        + "; ".join(problems)
        + ". Set checkpoint.allow_quant_change=true to resume anyway (weights are re-quantized "
        "with this spec's QuantConfig), or checkpoint.resume=never to start over."
    )


def step_of(path: Path) -> int | None:
    """N for a ``step_<N>`` directory name, else None."""
    digits = path.name.removeprefix("step_")
    return int(digits) if path.name.startswith("step_") and digits.isdigit() else None


__all__ = [
    "CHECKPOINTS",
    "FORMAT_VERSION",
    "LATEST",
    "META",
    "CheckpointError",
    "CheckpointMeta",
    "Skipped",
    "check_compatible",
    "checkpoint_steps",
    "latest_checkpoint",
    "prune_checkpoints",
    "read_meta",
    "select_checkpoint",
    "step_of",
    "verify_checkpoint",
    "warn_skipped",
]
