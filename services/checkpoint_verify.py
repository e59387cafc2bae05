"""Checkpoint integrity: a sha256 + size record of every file, and its verification.

Why this recipe: a checkpoint is only worth resuming from if every byte is what the writer wrote.
Sizes alone miss same-size garbage (issue 17 row 3: finite noise in the weights resumed silently
and then pruned the last good checkpoint), and a loader that trips over random bytes reports a
misleading "user error" with no path (row 4). So the manifest (``meta.json``, written last)
records ``{size, sha256}`` of every file in the step directory, whoever wrote it — the driver's
single ``model.safetensors`` + ``state.pt`` or the shard files trainer ranks write with
``torch.distributed.checkpoint`` — and the resume verifies all of them before any loader runs.

Cost: sha256 is read-bound on one core per file (``benchmarks/checkpoint_verify.py`` prints the
seconds per GB); files are hashed on a small thread pool (``hashlib`` releases the GIL on large
buffers), so a sharded checkpoint verifies in parallel.

Errors: a checkpoint that fails verification or cannot be read raises ``CheckpointCorruptError``,
an ``OSError`` (a storage fault, exit code 1), never a ``ValueError`` (the driver's "user error",
exit 2). The message names the checkpoint, the file and the reason.
"""

from __future__ import annotations

import hashlib
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from pydantic import Field

from fp8rl.protocol.base import StrictModel

CHUNK_BYTES = 8 * 2**20
"""Read size while hashing (large reads keep sha256 CPU-bound, not syscall-bound)."""

MAX_HASH_THREADS = 4
"""Files hashed concurrently."""


class CheckpointCorruptError(OSError):
    """A checkpoint whose data is missing, unreadable or not what its manifest recorded.

    A storage fault, not a user error: the message names the checkpoint directory, the file and
    the reason. ``resume: auto`` skips such a checkpoint and falls back to an older verified one.
    """


class FileRecord(StrictModel):
    """What the manifest records of one checkpoint file."""

    size: int = Field(ge=0)
    """Bytes."""

    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    """Hex sha256 of the file's bytes."""


def hash_file(path: Path) -> FileRecord:
    """Size and sha256 of ``path``, read in ``CHUNK_BYTES`` pieces.

    Raises:
        CheckpointCorruptError: the file cannot be opened or read (names the file and the OS error).
    """
    digest, size = hashlib.sha256(), 0
    buffer = bytearray(CHUNK_BYTES)
    view = memoryview(buffer)
    try:
        with open(path, "rb", buffering=0) as f:
            while n := f.readinto(buffer):
                digest.update(view[:n])
                size += n
    except OSError as error:
        raise CheckpointCorruptError(f"{path}: cannot read: {error.strerror or error}") from error
    return FileRecord(size=size, sha256=digest.hexdigest())


def checkpoint_files(directory: Path, *, exclude: tuple[str, ...] = ()) -> list[str]:
    """Relative paths of every regular file under ``directory`` (sorted), minus ``exclude``."""
    return sorted(
        rel
        for p in directory.rglob("*")
        if p.is_file() and (rel := p.relative_to(directory).as_posix()) not in exclude
    )


def hash_directory(directory: Path, *, exclude: tuple[str, ...] = ()) -> dict[str, FileRecord]:
    """``{relative path: FileRecord}`` of every file under ``directory`` (format-agnostic).

    Call it once every writer (driver or trainer ranks) is done, before the manifest is written.

    Raises:
        CheckpointCorruptError: a file cannot be read.
    """
    files = checkpoint_files(directory, exclude=exclude)
    with ThreadPoolExecutor(max_workers=_threads(len(files))) as pool:
        records = list(pool.map(hash_file, (directory / rel for rel in files)))
    return dict(zip(files, records, strict=True))


def verify_files(
    directory: Path, recorded: dict[str, FileRecord], *, checksums: bool = True
) -> None:
    """Check that every recorded file exists with its size and (``checksums``) its sha256.

    Sizes are checked for all files first (cheap), then the hashes. Files present but not
    recorded are ignored (the manifest is the contract).

    Raises:
        CheckpointCorruptError: ``"<directory>: <file> ..."`` for the first file missing, of
            another size, unreadable, or with another sha256.
    """
    for rel, record in recorded.items():
        file = directory / rel
        try:
            size = file.stat().st_size
        except FileNotFoundError:
            raise CheckpointCorruptError(f"{directory}: {rel} is missing") from None
        except OSError as error:
            raise CheckpointCorruptError(
                f"{directory}: {rel} cannot be read: {error.strerror or error}"
            ) from error
        if size != record.size:
            raise CheckpointCorruptError(
                f"{directory}: {rel} is {size} bytes, the manifest recorded {record.size} "
                "(truncated or overwritten)"
            )
    if not checksums:
        return
    names = list(recorded)
    with ThreadPoolExecutor(max_workers=_threads(len(names))) as pool:
        got = list(pool.map(hash_file, (directory / rel for rel in names)))
    for rel, now in zip(names, got, strict=True):
        if now.sha256 != recorded[rel].sha256:
            raise CheckpointCorruptError(
                f"{directory}: {rel} fails its checksum (sha256 {now.sha256[:12]}…, the manifest "
                f"recorded {recorded[rel].sha256[:12]}…): its bytes changed after the save"
            )


def _threads(num_files: int) -> int:
    return max(1, min(MAX_HASH_THREADS, num_files, os.cpu_count() or 1))


__all__ = [
    "CheckpointCorruptError",
    "FileRecord",
    "checkpoint_files",
    "hash_directory",
    "hash_file",
    "verify_files",
]
