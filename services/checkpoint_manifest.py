"""The checkpoint manifest (``meta.json``) and the choice of checkpoints to resume from and prune.

A checkpoint directory is usable when its manifest parses, names the directory's step, and every
file it records has the recorded size and sha256 (``checkpoint_verify``). The resume point is the
newest usable checkpoint marked healthy; a resume is refused under another quant contract
(``check_compatible``). Layout and the write recipe: ``fp8rl.services.checkpoint``.

Pruning (``keep_last``) counts and keeps only checkpoints that pass verification, and never
deletes the newest verified healthy one. A checkpoint that fails verification is never resumed
from, counted, pruned or overwritten; it is not deleted either (it may be the only copy to debug
a storage fault): it is moved aside to ``step_<N>.unverified-<time>`` (``set_aside_unverified``)
with a warning naming it and why, out of the ``step_<N>`` namespace that resume, pruning, saves,
exports and reports look at. Deleting it is the person's call.

Cost: verifying means hashing every byte, so callers that prune after every save pass the
results they already have (``VerifiedCheckpoints``: checkpoints verified at resume or hashed when
written); a known result is reused while the checkpoint's ``meta.json`` is the same file, with
only the quick size check repeated.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
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
UNVERIFIED = ".unverified-"
"""Infix of a checkpoint moved aside for failing verification: ``step_<N>.unverified-<time>``."""


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


def select_checkpoint(
    root: Path,
    *,
    checksums: bool = True,
    verify: Callable[[Path], CheckpointMeta] | None = None,
) -> tuple[Path | None, list[Skipped]]:
    """The resume point under ``root``: the newest checkpoint that verifies and is healthy.

    Newer ones passed over are returned as ``Skipped`` (path + reason), newest first. The
    ``latest`` pointer is not trusted for this: every candidate is verified, with ``verify``
    (e.g. ``VerifiedCheckpoints.verify``) or else ``verify_checkpoint(checksums=checksums)``.
    Returns ``(None, skipped)`` when no checkpoint qualifies.
    """
    verify = verify or functools.partial(verify_checkpoint, checksums=checksums)
    skipped: list[Skipped] = []
    for step in reversed(checkpoint_steps(root)):
        path = root / f"step_{step}"
        try:
            meta = verify(path)
        except CheckpointCorruptError as error:
            skipped.append(Skipped(path, _reason(path, error), corrupt=True))
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


class VerifiedCheckpoints:
    """The checkpoints this process has verified (sha256 of every file), so that the pruning after
    every save does not hash them again.

    A result stays valid while the checkpoint's ``meta.json`` is the same file (device, inode,
    size, mtime): a re-save of the step, or files copied over it, make it unknown again. A reused
    result still gets the quick check (manifest + sizes: a few ``stat`` calls), so a checkpoint
    truncated or deleted since is caught.
    """

    def __init__(self) -> None:
        self._known: dict[Path, tuple[int, ...]] = {}

    def __contains__(self, path: object) -> bool:
        """True when ``path`` was verified (or written) by this process and is unchanged since."""
        if not isinstance(path, Path) or path not in self._known:
            return False
        return self._known[path] == _identity(path)

    def remember(self, path: Path) -> None:
        """Record ``path`` as verified: it was hashed just now (a save, ``find_checkpoint``)."""
        identity = _identity(path)
        if identity is not None:
            self._known[path] = identity

    def verify(self, path: Path) -> CheckpointMeta:
        """``verify_checkpoint(path)``, hashing only when there is no valid earlier result.

        Raises:
            CheckpointCorruptError: as ``verify_checkpoint``; the path is forgotten.
        """
        known = path in self
        try:
            meta = verify_checkpoint(path, checksums=not known)
        except CheckpointCorruptError:
            self._known.pop(path, None)
            raise
        if not known:
            self.remember(path)
        return meta


@dataclass(frozen=True)
class Pruned:
    """What ``prune_checkpoints`` did to the ``step_<N>`` directories of one root."""

    kept: list[Path] = field(default_factory=list)
    """Verified checkpoints kept, newest first."""

    deleted: list[Path] = field(default_factory=list)
    """Checkpoints deleted, oldest first."""

    set_aside: list[Path] = field(default_factory=list)
    """Checkpoints that failed verification, at their new ``step_<N>.unverified-<time>`` paths."""

    anchor: Path | None = None
    """The newest verified healthy checkpoint (the resume point; ``latest`` should name it)."""


def prune_checkpoints(
    root: Path,
    *,
    keep_last: int,
    anchor: Path | None = None,
    verify: Callable[[Path], CheckpointMeta] = verify_checkpoint,
) -> Pruned:
    """Keep the newest ``keep_last`` checkpoints that pass verification, plus the newest verified
    healthy one and ``anchor``; delete the older ones.

    Walks ``step_<N>`` newest first, verifying each (``verify``: pass
    ``VerifiedCheckpoints.verify`` to reuse earlier results instead of hashing every checkpoint
    on every save):

    - one that fails verification is moved aside (``set_aside_unverified``, logged with the
      reason): not counted, not deleted, and a later save of its step cannot overwrite it;
    - one that verifies counts towards ``keep_last`` whether healthy or not (an unhealthy one is
      kept for inspection while it is among the newest);
    - once ``keep_last`` are counted and a verified healthy one has been seen, older checkpoints
      are deleted without being hashed (keep_last asks for that whatever their state), except
      ``anchor``.

    So a damaged newer checkpoint never pushes the newest verified one out, and the resume point
    always survives.

    Args:
        keep_last: verified checkpoints kept (``checkpoint.keep_last``, >= 1).
        anchor: a checkpoint known to be verified and healthy (the run's resume point or its
            newest healthy save): never deleted, even past ``keep_last`` (it is verified like
            the others: if it fails now, it is moved aside). A path outside ``root`` is ignored.
        verify: returns the manifest of a verified checkpoint or raises
            ``CheckpointCorruptError``.
    Returns what was kept, deleted and moved aside, and the newest verified healthy checkpoint.
    """
    assert keep_last >= 1, keep_last
    anchor = anchor if anchor is not None and anchor.parent == root else None
    kept: list[Path] = []
    deleted: list[Path] = []
    aside: list[Path] = []
    counted, healthy = 0, None
    for step in reversed(checkpoint_steps(root)):
        path = root / f"step_{step}"
        if counted >= keep_last and healthy is not None and path != anchor:
            deleted.append(path)
            continue
        try:
            meta = verify(path)
        except CheckpointCorruptError as error:
            aside.append(set_aside_unverified(path, reason=_reason(path, error)))
            continue
        newest_healthy = meta.healthy and healthy is None
        if counted < keep_last:
            counted += 1
        elif not (newest_healthy or path == anchor):  # unhealthy, past keep_last
            deleted.append(path)
            continue
        kept.append(path)
        if newest_healthy:
            healthy = path
    for path in reversed(deleted):
        shutil.rmtree(path, ignore_errors=True)
    return Pruned(kept=kept, deleted=deleted[::-1], set_aside=aside, anchor=healthy)


def set_aside_unverified(path: Path, *, reason: str) -> Path:
    """Rename the checkpoint ``path`` (``step_<N>``) that failed verification to
    ``step_<N>.unverified-<local time>`` in the same directory (an atomic rename) and log a
    warning naming both paths and ``reason``. Returns the new path.

    The new name is outside the ``step_<N>`` namespace: never resumed from, counted by
    ``keep_last``, pruned, overwritten by a save of step N or deleted by fp8rl.
    """
    stamp = time.strftime("%Y%m%d-%H%M%S")
    target = path.with_name(f"{path.name}{UNVERIFIED}{stamp}")
    if target.exists():  # two in one second
        target = target.with_name(f"{target.name}-{time.time_ns() % 10**9}")
    os.rename(path, target)
    log.warning(
        "moved checkpoint %s aside to %s: %s. It fails verification, so it is never resumed "
        "from, counted by keep_last, pruned or overwritten; inspect it, then delete it",
        path,
        target.name,
        reason,
    )
    return target


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


def _reason(path: Path, error: CheckpointCorruptError) -> str:
    return str(error).removeprefix(f"{path}: ")


def _identity(path: Path) -> tuple[int, ...] | None:
    """Which ``meta.json`` file ``path`` holds now (None: none)."""
    try:
        st = (path / META).stat()
    except OSError:
        return None
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


def step_of(path: Path) -> int | None:
    """N for a ``step_<N>`` directory name, else None."""
    digits = path.name.removeprefix("step_")
    return int(digits) if path.name.startswith("step_") and digits.isdigit() else None


__all__ = [
    "CHECKPOINTS",
    "FORMAT_VERSION",
    "LATEST",
    "META",
    "UNVERIFIED",
    "CheckpointError",
    "CheckpointMeta",
    "Pruned",
    "Skipped",
    "VerifiedCheckpoints",
    "check_compatible",
    "checkpoint_steps",
    "latest_checkpoint",
    "prune_checkpoints",
    "read_meta",
    "select_checkpoint",
    "set_aside_unverified",
    "step_of",
    "verify_checkpoint",
    "warn_skipped",
]
