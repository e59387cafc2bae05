"""Checkpoints of the full training state, written atomically, and resume.

Layout (``<run_dir>/checkpoints/``)::

    step_<N>/               N = RL steps completed; a resumed run continues at step index N
      trainer/              written by the trainer ranks themselves (torch.distributed.checkpoint):
        .metadata, __<rank>_0.distcp   master weights ("model.*", HF names) and AdamW state
        rank_<r>.pt         each rank's LR scheduler, policy version and RNG
      state.pt              the driver's RNG
      tokenizer/            tokenizer files + chat template (so exports need no model source)
      meta.json             CheckpointMeta (the manifest): step, healthy, version, data cursor,
                            quant fingerprint, resolved JobSpec, decoder config, and the size and
                            sha256 of every other file in the directory
    latest                  "step_<N>": the newest healthy checkpoint (a hint for people; the
                            resume point is chosen by verifying, see below)
    step_<N>.unverified-<time>/   a checkpoint that failed verification, moved aside (below)

Why this recipe: a checkpoint is written into ``.tmp-step_<N>-<pid>/`` (by the driver, or by
trainer ranks writing their own shard files), every file fsynced; once all writers are done every
file in the directory is hashed (``checkpoint_verify``), ``meta.json`` is written last, the
directory renamed into place (atomic on POSIX) and only then ``latest`` replaced (write a temp
file, fsync, ``os.replace``). A ``kill -9`` at any point therefore leaves either the old pointer to
an old complete checkpoint or the new pointer to a new complete one; half-written ``.tmp-*``
directories are never pointed at and are removed at the next start. A save of a step that already
has a directory (a resumed run reaching a step of the branch it abandoned) swaps it out with two
renames (``step_<N>`` → ``.old-step_<N>-<pid>``, then the new one into place); a failure between
them puts the old one back, and a ``kill -9`` between them is undone at the next start, so the
step holds the old or the new checkpoint, never neither.

Resume (``resume: auto``) walks the checkpoints newest first and verifies each (manifest, sizes,
sha256 of every file) before any loader touches it: one that fails is skipped with its path and
reason (logged, so ``fp8rl run`` / ``fp8rl runs logs`` show it), and so is one marked
``healthy: false`` (written after the run's last healthy step); the first verified healthy one is
the resume point. Unreadable or damaged data raises ``CheckpointCorruptError`` (an ``OSError``, a
storage fault: exit code 1), never the "user error" ``ValueError``; when no checkpoint to resume
passes verification the driver refuses the resume as a user error (exit code 2: restore the files
or pick another checkpoint).

The abandoned branch: checkpoints newer than the resume point (those ``auto`` skipped, or those
past a checkpoint named in ``checkpoint.resume`` in this run's own directory, verified then) are
handled once the resume is accepted:

- one that fails verification is moved aside to ``step_<N>.unverified-<time>`` with a warning
  naming it and why: never resumed from, counted by ``keep_last``, pruned, overwritten by this
  run's save of step N, or deleted (it may be the only copy to debug the fault; deleting it is the
  person's call);
- one that verifies (``healthy: false``, or past a named resume point) stays, named in a warning:
  like verl and TorchTitan, the resumed run replaces it when it saves step N again (atomically,
  above); until then it counts as a verified checkpoint for ``keep_last`` (never at the expense
  of the resume point, which pruning always keeps).

Pruning (``keep_last``, after every save) keeps the newest ``keep_last`` checkpoints that pass
verification plus the newest verified healthy one, and deletes the older ones
(``prune_checkpoints``). It reuses the verification results this run already has (resume, or the
hashes taken while writing) instead of re-hashing every checkpoint on every save: each checkpoint
is hashed at most once per run.

RNG: the trainer's torch RNG (CPU and CUDA) and the driver's torch/Python RNG are saved. Rollout
engines need none: every request samples from a generator seeded with ``(seed, step, round)``
(``rollout_phase.collect``), reward functions are rules and the reference is deterministic, so
the data of step N depends only on the restored weights, the data cursor and N.

The quant contract survives restarts: a checkpoint written under another QuantConfig (or
precision mode) is refused, naming both fingerprints and the differing fields, unless the spec
sets ``checkpoint.allow_quant_change``.
"""

from __future__ import annotations

import datetime
import logging
import os
import random
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from fp8rl.protocol import JobSpec
from fp8rl.services.checkpoint_manifest import (
    CHECKPOINTS,
    FORMAT_VERSION,
    LATEST,
    META,
    UNVERIFIED,
    CheckpointError,
    CheckpointMeta,
    Pruned,
    Skipped,
    VerifiedCheckpoints,
    check_compatible,
    checkpoint_steps,
    latest_checkpoint,
    prune_checkpoints,
    read_meta,
    select_checkpoint,
    set_aside_unverified,
    step_of,
    verify_checkpoint,
    warn_skipped,
)
from fp8rl.services.checkpoint_verify import CheckpointCorruptError, hash_directory
from fp8rl.workers.trainer.dcp_state import single_process_io

log = logging.getLogger(__name__)

TRAINER_DIR = "trainer"
"""The ranks' ``torch.distributed.checkpoint`` directory (``TrainerWorker.save``)."""
STATE_FILE = "state.pt"
TOKENIZER_DIR = "tokenizer"
TOKENIZER_PATTERNS = (
    "tokenizer*",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.*",
    "merges.txt",
    "chat_template*",
    "generation_config.json",
    "*.model",
)
"""Files copied from the model's tokenizer directory (Hugging Face tokenizer layouts)."""

TEST_DELAY_ENV = "FP8RL_TEST_CHECKPOINT_DELAY"
"""Test hook ``"STEP:SECONDS"``: saves of step_N with N >= STEP sleep mid-write (kill -9 tests)."""


# --------------------------------------------------------------------------------------------
# pure file operations (no Ray): write, verify, select, read, prune


def write_checkpoint(
    root: Path,
    *,
    step: int,
    job: JobSpec,
    write_trainer: Callable[[Path], list[str]],
    policy_version: int,
    data_cursor: dict[str, Any],
    model_config: dict[str, Any],
    tokenizer_dir: Path | None,
    driver_rng: dict[str, Any] | None = None,
    healthy: bool = True,
) -> Path:
    """Write ``root/step_<step>`` atomically; return its path. The driver never holds tensors:
    every trainer rank writes its own shards into the temporary directory (``write_trainer``).

    Args:
        root: the run's ``checkpoints`` directory (created when missing).
        step: RL steps completed.
        job: the resolved spec (stored, and its quant fingerprint).
        write_trainer: called with the temporary directory; every trainer rank writes its shards
            there (``TrainerWorker.save``); returns the relative paths written.
        policy_version: the trainer's optimizer steps.
        data_cursor: ``PromptSampler.state_dict()``.
        model_config: ``DecoderConfig.to_dict()``.
        tokenizer_dir: copied into ``tokenizer/`` (None: no tokenizer, e.g. random presets).
        driver_rng: ``driver_rng_state()`` of the driver process.
        healthy: False for a checkpoint written after the run's last healthy step: recorded in
            the manifest, and ``latest`` does not move to it.
    An existing ``step_<step>`` (from an earlier attempt) is replaced only once the new one is
    complete, atomically (``commit_checkpoint``).

    Raises:
        CheckpointError: a file a rank reported is not there.
    """
    start = time.perf_counter()
    tmp = begin_checkpoint(root, step)
    written = write_trainer(tmp)
    missing = sorted(rel for rel in written if not (tmp / rel).is_file())
    if missing:
        raise CheckpointError(f"trainer ranks reported files that are not there: {missing[:5]}")
    for rel in written:
        _fsync_file(tmp / rel)
    _test_delay(step)
    with open(tmp / STATE_FILE, "wb") as f:
        torch.save({"driver_rng": driver_rng or {}}, f)
        _flush_and_sync(f)
    return commit_checkpoint(
        root,
        tmp,
        step=step,
        job=job,
        policy_version=policy_version,
        master_dtype=job.checkpoint.weights_dtype,
        data_cursor=data_cursor,
        model_config=model_config,
        tokenizer_dir=tokenizer_dir,
        healthy=healthy,
        started=start,
    )


def begin_checkpoint(root: Path, step: int) -> Path:
    """A fresh ``root/.tmp-step_<step>-<pid>/`` for the writers of ``step`` (driver or ranks)."""
    root.mkdir(parents=True, exist_ok=True)
    tmp = root / f".tmp-step_{step}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    return tmp


def commit_checkpoint(
    root: Path,
    tmp: Path,
    *,
    step: int,
    job: JobSpec,
    policy_version: int,
    master_dtype: str,
    data_cursor: dict[str, Any],
    model_config: dict[str, Any],
    tokenizer_dir: Path | None,
    healthy: bool,
    started: float,
) -> Path:
    """Seal ``tmp`` once every writer is done: tokenizer, sha256 of every file, ``meta.json``
    last, rename to ``root/step_<step>``, then move ``latest`` (healthy checkpoints only).

    An existing ``step_<step>`` is replaced whole: moved to ``.old-step_<step>-<pid>``, the new
    one renamed into place, the old one deleted. If the second rename fails the old one is put
    back (and the error raised); after a ``kill -9`` between the two, ``remove_interrupted_saves``
    puts it back at the next start. The caller decides whether the existing one may be replaced
    (``Checkpointer.save`` moves an unverifiable one aside first).

    ``started``: ``time.perf_counter()`` when the save began. Returns the final path.

    Raises:
        CheckpointCorruptError: a written file cannot be read back for hashing.
        OSError: the new checkpoint cannot be renamed into place (the old one is back).
    """
    if tokenizer_dir is not None:
        _copy_tokenizer(tokenizer_dir, tmp / TOKENIZER_DIR)
    files = hash_directory(tmp, exclude=(META,))
    meta = CheckpointMeta(
        step=step,
        healthy=healthy,
        policy_version=policy_version,
        quant_fingerprint=job.precision.quant.fingerprint(),
        quant=job.precision.quant,
        precision_mode=job.precision.mode,
        model_path=job.model.path,
        decoder_config=model_config,
        master_dtype=master_dtype,
        data_cursor=data_cursor,
        job=job.model_dump(mode="json"),
        files=files,
        created_at=datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        save_seconds=time.perf_counter() - started,
    )
    _write_text_synced(tmp / META, meta.model_dump_json(indent=2))
    _fsync_dir(tmp)
    final = root / f"step_{step}"
    if final.exists():  # an earlier attempt of this step: swap it out only now
        old = root / f".old-{final.name}-{os.getpid()}"
        os.replace(final, old)
        try:
            os.replace(tmp, final)
        except BaseException:
            os.replace(old, final)
            raise
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(tmp, final)
    _fsync_dir(root)
    if healthy:
        point_latest(root, final)
    return final


def find_checkpoint(location: Path, *, step: int | None = None) -> Path:
    """A verified checkpoint from a run directory, a ``checkpoints`` directory or a checkpoint.

    ``step``: that step's checkpoint (verified, healthy or not) instead of the resume point.
    Checkpoints passed over are logged with their reason.

    Raises:
        CheckpointError: nothing there (the message lists the steps that exist), only
            unhealthy checkpoints, or a checkpoint moved aside as ``step_<N>.unverified-*``
            (a user error: exit code 2).
        CheckpointCorruptError: the named checkpoint, or every candidate, fails verification.
    """
    location = Path(location).expanduser()
    if not location.exists():
        raise CheckpointError(f"no complete checkpoint under {location}: it does not exist")
    if step is None and (step_of(location) is not None or (location / META).is_file()):
        if UNVERIFIED in location.name:
            raise CheckpointError(
                f"{location} was moved aside for failing verification; it is never resumed "
                "from. If its files were restored, rename it back to step_<N> first"
            )
        verify_checkpoint(location)
        return location
    root = location / CHECKPOINTS if (location / CHECKPOINTS).is_dir() else location
    if step is not None:
        path = root / f"step_{step}"
        if not path.is_dir():
            raise CheckpointError(
                f"no checkpoint for step {step} in {root}; available: {checkpoint_steps(root)}"
            )
        verify_checkpoint(path)
        return path
    found, skipped = select_checkpoint(root)
    warn_skipped(skipped)
    if found is not None:
        return found
    if not skipped:
        raise CheckpointError(f"no complete checkpoint under {location}")
    reasons = "; ".join(f"{s.path.name}: {s.reason}" for s in skipped)
    if any(s.corrupt for s in skipped):
        raise CheckpointCorruptError(f"no usable checkpoint under {location}: {reasons}")
    raise CheckpointError(f"no healthy checkpoint under {location}: {reasons}")


def checkpoint_step(path: Path | None) -> int:
    """Steps completed in the checkpoint at ``path`` (0 for None: a fresh start)."""
    return 0 if path is None else read_meta(path).step


def read_checkpoint(path: Path, *, checksums: bool = True) -> tuple[CheckpointMeta, dict[str, Any]]:
    """(meta, driver RNG state); the trainer ranks ``load`` their own state from ``path``.

    ``checksums=False`` when ``path`` was verified moments ago (sizes are still checked).

    Raises:
        CheckpointCorruptError: verification fails, or a file cannot be decoded (names it).
    """
    meta = verify_checkpoint(path, checksums=checksums)
    saved = _load(path / STATE_FILE, lambda f: torch.load(f, map_location="cpu", weights_only=True))
    return meta, saved.get("driver_rng", {})


def read_model_weights(path: Path, *, checksums: bool = True) -> dict[str, torch.Tensor]:
    """The master weights of a checkpoint (HF names, saved dtype), consolidated from the ranks'
    DCP shards in this process (no process group needed).

    Raises:
        CheckpointCorruptError: verification fails, or the weights cannot be decoded.
    """
    verify_checkpoint(path, checksums=checksums)
    return _load(path / TRAINER_DIR, _consolidate)


def _consolidate(directory: Path) -> dict[str, torch.Tensor]:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    reader = dcp.FileSystemReader(directory)
    state = {
        key.removeprefix("model."): torch.empty(item.size, dtype=item.properties.dtype)
        for key, item in reader.read_metadata().state_dict_metadata.items()
        if key.startswith("model.") and isinstance(item, TensorStorageMetadata)
    }
    with single_process_io():
        dcp.load({"model": state}, storage_reader=reader, no_dist=True)
    return state


def write_model_shards(directory: Path, weights: dict[str, torch.Tensor]) -> list[str]:
    """Write ``weights`` (HF names) as a one-rank trainer checkpoint without optimizer state —
    the ``write_trainer`` of ``write_checkpoint`` for weights that no trainer holds (tests,
    imports). Returns the relative paths written."""
    import torch.distributed.checkpoint as dcp

    target = directory / TRAINER_DIR
    with single_process_io():
        dcp.save({"model": dict(weights)}, checkpoint_id=target, no_dist=True)
    return [str(p.relative_to(directory)) for p in sorted(target.iterdir()) if p.is_file()]


def remove_interrupted_saves(root: Path) -> list[Path]:
    """Delete ``.tmp-*`` / ``.old-*`` leftovers of killed saves (call with no save running);
    return the deleted paths.

    An ``.old-step_<N>-<pid>`` whose ``step_<N>`` is missing is a re-save killed between its two
    renames (``commit_checkpoint``): it is the previous checkpoint of step N, renamed back, not
    deleted. Moved-aside ``step_<N>.unverified-*`` directories are never touched.
    """
    if not root.is_dir():
        return []
    for old in sorted(root.glob(".old-step_*")):
        final = root / old.name.removeprefix(".old-").rpartition("-")[0]
        if old.is_dir() and step_of(final) is not None and not final.exists():
            os.replace(old, final)
            log.warning("put back %s: a re-save of it was interrupted (%s)", final, old.name)
    leftovers = [p for p in root.iterdir() if p.name.startswith((".tmp-", ".old-"))]
    for path in leftovers:
        if path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
    return leftovers


def driver_rng_state() -> dict[str, Any]:
    """The driver process's torch (CPU) and Python ``random`` states."""
    return {"torch": torch.get_rng_state(), "python": random.getstate()}


def set_driver_rng_state(state: dict[str, Any]) -> None:
    """Restore ``driver_rng_state()`` (missing entries are left alone)."""
    if "torch" in state:
        torch.set_rng_state(state["torch"])
    if "python" in state:
        version, internal, gauss = state["python"]
        random.setstate((version, tuple(internal), gauss))


# --------------------------------------------------------------------------------------------
# helpers


def _load(path: Path, loader: Callable[[Path], Any]) -> Any:
    """``loader(path)``, with any decode or read error re-raised naming the file.

    Raises:
        CheckpointCorruptError: ``"<file>: cannot load: <error>"``.
    """
    try:
        return loader(path)
    except Exception as error:  # safetensors, pickle and torch raise many types; all are storage
        raise CheckpointCorruptError(
            f"{path}: cannot load: {type(error).__name__}: {error}"
        ) from error


def latest_pointer(root: Path) -> str | None:
    """The checkpoint name in ``root/latest`` (``"step_<N>"``), or None when unreadable."""
    try:
        return (root / LATEST).read_text().strip()
    except OSError:
        return None


def point_latest(root: Path, path: Path) -> None:
    """Point ``root/latest`` at checkpoint ``path`` (temp file, fsync, ``os.replace``)."""
    _write_text_synced(root / f".{LATEST}.tmp", path.name + "\n", replace=root / LATEST)
    _fsync_dir(root)


def _copy_tokenizer(source: Path, target: Path) -> None:
    target.mkdir(parents=True, exist_ok=True)
    for pattern in TOKENIZER_PATTERNS:
        for file in source.glob(pattern):
            if file.is_file():
                shutil.copyfile(file, target / file.name)
                _fsync_file(target / file.name)
    _fsync_dir(target)


def _test_delay(step: int) -> None:
    raw = os.environ.get(TEST_DELAY_ENV)
    if not raw:
        return
    first, _, seconds = raw.partition(":")
    if step >= int(first):
        log.warning("%s=%s: pausing the save of step %d", TEST_DELAY_ENV, raw, step)
        time.sleep(float(seconds))


def _flush_and_sync(f: Any) -> None:
    f.flush()
    os.fsync(f.fileno())


def _fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_text_synced(path: Path, text: str, *, replace: Path | None = None) -> None:
    with open(path, "w") as f:
        f.write(text)
        _flush_and_sync(f)
    if replace is not None:
        os.replace(path, replace)


__all__ = [
    "CHECKPOINTS",
    "FORMAT_VERSION",
    "LATEST",
    "META",
    "STATE_FILE",
    "TEST_DELAY_ENV",
    "TOKENIZER_DIR",
    "TRAINER_DIR",
    "UNVERIFIED",
    "CheckpointCorruptError",
    "CheckpointError",
    "CheckpointMeta",
    "Pruned",
    "Skipped",
    "VerifiedCheckpoints",
    "begin_checkpoint",
    "check_compatible",
    "checkpoint_step",
    "checkpoint_steps",
    "commit_checkpoint",
    "driver_rng_state",
    "find_checkpoint",
    "latest_checkpoint",
    "latest_pointer",
    "point_latest",
    "prune_checkpoints",
    "read_checkpoint",
    "read_meta",
    "read_model_weights",
    "remove_interrupted_saves",
    "select_checkpoint",
    "set_aside_unverified",
    "set_driver_rng_state",
    "verify_checkpoint",
    "warn_skipped",
    "write_checkpoint",
    "write_model_shards",
]
