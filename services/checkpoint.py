"""Checkpoints of the full training state, written atomically, and resume.

Layout (``<run_dir>/checkpoints/``)::

    step_<N>/               N = RL steps completed; a resumed run continues at step index N
      trainer/              written by the trainer ranks themselves (torch.distributed.checkpoint):
        .metadata, __<rank>_0.distcp   master weights ("model.*", HF names) and AdamW state
        rank_<r>.pt         each rank's LR scheduler, policy version and RNG
      state.pt              the driver's RNG
      tokenizer/            tokenizer files + chat template (so exports need no model source)
      meta.json             CheckpointMeta: step, version, data cursor, quant fingerprint,
                            resolved JobSpec, decoder config, the byte size of every file
    latest                  "step_<N>": the newest complete checkpoint (written last)

The driver never holds tensors: it creates the temporary directory, asks every trainer rank to
``save`` into it, records the files the ranks report, then commits. Resume works with another
rank count (DCP reshards), and ``read_model_weights`` consolidates the shards for exports.

Why this recipe: a checkpoint is written into ``.tmp-step_<N>-<pid>/``, every file fsynced,
``meta.json`` last, the directory renamed into place (atomic on POSIX) and only then ``latest``
replaced (write a temp file, fsync, ``os.replace``). A ``kill -9`` at any point therefore leaves
either the old pointer to an old complete checkpoint or the new pointer to a new complete one;
half-written ``.tmp-*`` directories are never pointed at and are removed at the next start.

RNG: each trainer rank's torch RNG (CPU and CUDA) and the driver's torch/Python RNG are saved. Rollout
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
from pydantic import Field

from fp8rl.protocol import JobSpec, QuantConfig
from fp8rl.protocol.base import StrictModel

log = logging.getLogger(__name__)

CHECKPOINTS = "checkpoints"
LATEST = "latest"
META = "meta.json"
TRAINER_DIR = "trainer"
"""The ranks' ``torch.distributed.checkpoint`` directory (``TrainerWorker.save``)."""
STATE_FILE = "state.pt"
FORMAT_VERSION = 2
"""2: rank-written DCP shards. 1 (refused): one unsharded model.safetensors + state.pt."""
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


class CheckpointError(ValueError):
    """A checkpoint that cannot be used: incomplete, missing, or from an incompatible spec."""


class CheckpointMeta(StrictModel):
    """``meta.json``: what a checkpoint holds and under which contract it was written."""

    format_version: int = FORMAT_VERSION
    """Layout version of the checkpoint directory."""

    step: int = Field(ge=0)
    """RL steps completed; the resumed run's first step index."""

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

    files: dict[str, int]
    """Relative path → size in bytes of every file written before this meta (completeness)."""

    created_at: str
    """UTC time the save finished (ISO 8601)."""

    save_seconds: float = 0.0
    """Wall time of the save."""


# --------------------------------------------------------------------------------------------
# pure file operations (no Ray): write, verify, find, read, prune


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
) -> Path:
    """Write ``root/step_<step>`` atomically, then point ``root/latest`` at it; return its path.

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
    An existing ``step_<step>`` (from an earlier attempt) is replaced only once the new one is
    complete.

    Raises:
        CheckpointError: a file a rank reported is not there.
    """
    start = time.perf_counter()
    root.mkdir(parents=True, exist_ok=True)
    name = f"step_{step}"
    tmp = root / f".tmp-{name}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    written = write_trainer(tmp)
    for rel in written:
        _fsync_file(tmp / rel)
    _test_delay(step)
    with open(tmp / STATE_FILE, "wb") as f:
        torch.save({"driver_rng": driver_rng or {}}, f)
        _flush_and_sync(f)
    if tokenizer_dir is not None:
        _copy_tokenizer(tokenizer_dir, tmp / TOKENIZER_DIR)
    files = {
        str(p.relative_to(tmp)): p.stat().st_size for p in sorted(tmp.rglob("*")) if p.is_file()
    }
    missing = sorted(set(written) - set(files))
    if missing:
        raise CheckpointError(f"trainer ranks reported files that are not there: {missing[:5]}")
    meta = CheckpointMeta(
        step=step,
        policy_version=policy_version,
        quant_fingerprint=job.precision.quant.fingerprint(),
        quant=job.precision.quant,
        precision_mode=job.precision.mode,
        model_path=job.model.path,
        decoder_config=model_config,
        master_dtype=job.trainer.master_dtype,
        data_cursor=data_cursor,
        job=job.model_dump(mode="json"),
        files=files,
        created_at=datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        save_seconds=time.perf_counter() - start,
    )
    _write_text_synced(tmp / META, meta.model_dump_json(indent=2))
    _fsync_dir(tmp)
    final = root / name
    if final.exists():  # an earlier attempt of this step: swap it out only now
        old = root / f".old-{name}-{os.getpid()}"
        os.replace(final, old)
        os.replace(tmp, final)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(tmp, final)
    _fsync_dir(root)
    _write_text_synced(root / f".{LATEST}.tmp", name + "\n", replace=root / LATEST)
    _fsync_dir(root)
    return final


def verify_checkpoint(path: Path) -> CheckpointMeta:
    """The meta of a complete checkpoint directory.

    Raises:
        CheckpointError: no ``meta.json`` (an interrupted save), unreadable meta, or a file that
            is missing or has a different size than recorded.
    """
    meta_path = path / META
    if not meta_path.is_file():
        raise CheckpointError(f"{path} is not a complete checkpoint: {META} is missing")
    try:
        meta = CheckpointMeta.model_validate_json(meta_path.read_text())
    except ValueError as error:
        raise CheckpointError(f"{meta_path} is unreadable: {error}") from error
    if meta.format_version != FORMAT_VERSION:
        raise CheckpointError(
            f"{path} is a format-{meta.format_version} checkpoint (one unsharded "
            "model.safetensors + state.pt, written by an older fp8rl); this version resumes and "
            f"exports only rank-written checkpoints (format {FORMAT_VERSION}). Export it with the "
            "fp8rl that wrote it, or start over with checkpoint.resume=never"
        )
    for rel, size in meta.files.items():
        file = path / rel
        if not file.is_file() or file.stat().st_size != size:
            got = file.stat().st_size if file.is_file() else "missing"
            raise CheckpointError(f"{path}: {rel} is {got}, the checkpoint recorded {size} bytes")
    return meta


def checkpoint_steps(root: Path) -> list[int]:
    """Steps of the ``step_<N>`` directories under ``root`` (complete or not), ascending."""
    if not root.is_dir():
        return []
    steps = []
    for p in root.iterdir():
        if p.is_dir() and p.name.startswith("step_") and p.name[5:].isdigit():
            steps.append(int(p.name[5:]))
    return sorted(steps)


def latest_checkpoint(root: Path) -> Path | None:
    """The checkpoint ``root/latest`` points at; without a usable pointer, the newest complete one.

    Returns None when ``root`` holds no complete checkpoint.
    """
    pointer = root / LATEST
    if pointer.is_file():
        target = root / pointer.read_text().strip()
        try:
            verify_checkpoint(target)
            return target
        except CheckpointError as error:
            log.warning("ignoring %s: %s", pointer, error)
    for step in reversed(checkpoint_steps(root)):
        try:
            verify_checkpoint(root / f"step_{step}")
            return root / f"step_{step}"
        except CheckpointError:
            continue
    return None


def find_checkpoint(location: Path, *, step: int | None = None) -> Path:
    """A checkpoint directory from a run directory, a ``checkpoints`` directory or a checkpoint.

    ``step``: that step's checkpoint instead of the latest one.

    Raises:
        CheckpointError: nothing usable there (the message lists the steps that exist).
    """
    location = Path(location).expanduser()
    if (location / META).is_file() and step is None:
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
    found = latest_checkpoint(root)
    if found is None:
        raise CheckpointError(f"no complete checkpoint under {location}")
    return found


def checkpoint_step(path: Path | None) -> int:
    """Steps completed in the checkpoint at ``path`` (0 for None: a fresh start)."""
    return 0 if path is None else verify_checkpoint(path).step


def read_checkpoint(path: Path) -> tuple[CheckpointMeta, dict[str, Any]]:
    """(meta, driver RNG state); the trainer ranks ``load`` their own state from ``path``.

    Raises:
        CheckpointError: the checkpoint is incomplete or of an older format.
    """
    meta = verify_checkpoint(path)
    saved = torch.load(path / STATE_FILE, map_location="cpu", weights_only=True)
    return meta, saved.get("driver_rng", {})


def read_model_weights(path: Path) -> dict[str, torch.Tensor]:
    """The master weights of a checkpoint (HF names, saved dtype), consolidated from the ranks'
    DCP shards in this process (no process group)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    verify_checkpoint(path)
    reader = dcp.FileSystemReader(path / TRAINER_DIR)
    state = {
        key.removeprefix("model."): torch.empty(item.size, dtype=item.properties.dtype)
        for key, item in reader.read_metadata().state_dict_metadata.items()
        if key.startswith("model.") and isinstance(item, TensorStorageMetadata)
    }
    dcp.load({"model": state}, storage_reader=reader, no_dist=True)
    return state


def write_model_shards(directory: Path, weights: dict[str, torch.Tensor]) -> list[str]:
    """Write ``weights`` (HF names) as a one-rank trainer checkpoint without optimizer state —
    the ``write_trainer`` of ``write_checkpoint`` for weights that no trainer holds (tests,
    imports). Returns the relative paths written."""
    import torch.distributed.checkpoint as dcp

    target = directory / TRAINER_DIR
    dcp.save({"model": dict(weights)}, checkpoint_id=target, no_dist=True)
    return [str(p.relative_to(directory)) for p in sorted(target.iterdir()) if p.is_file()]


def prune_checkpoints(root: Path, *, keep_last: int) -> list[Path]:
    """Delete all but the newest ``keep_last`` checkpoints (never the one ``latest`` names).

    Returns the deleted paths.
    """
    pointer = root / LATEST
    keep = {pointer.read_text().strip()} if pointer.is_file() else set()
    steps = checkpoint_steps(root)
    keep |= {f"step_{s}" for s in steps[-keep_last:]}
    deleted = []
    for step in steps:
        path = root / f"step_{step}"
        if path.name not in keep:
            shutil.rmtree(path, ignore_errors=True)
            deleted.append(path)
    return deleted


def remove_interrupted_saves(root: Path) -> list[Path]:
    """Delete ``.tmp-*`` / ``.old-*`` leftovers of killed saves (call with no save running)."""
    if not root.is_dir():
        return []
    leftovers = [p for p in root.iterdir() if p.name.startswith((".tmp-", ".old-"))]
    for path in leftovers:
        if path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
    return leftovers


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
# the driver's view: resolve → restore → save every N steps / at the end


class Checkpointer:
    """The driver's checkpoint hooks for one run directory.

    ``trainers`` arguments are the trainer ranks: TrainerWorker actor handles (``save``, ``load``,
    ``current_version``) or, in tests, plain objects with those methods.
    """

    def __init__(self, run_dir: Path, job: JobSpec) -> None:
        self.root, self.job, self.spec = run_dir / CHECKPOINTS, job, job.checkpoint
        self.last_saved: int | None = None
        self._model: tuple[dict[str, Any], Path | None] | None = None
        removed = remove_interrupted_saves(self.root)
        if removed:
            log.warning("removed %d interrupted checkpoint save(s) in %s", len(removed), self.root)

    def resolve(self) -> Path | None:
        """The checkpoint to resume from per ``checkpoint.resume``, checked against the spec.

        Raises:
            CheckpointError: ``resume`` is a path without a usable checkpoint, or the checkpoint
                is under another quant contract.
        """
        resume = self.spec.resume
        if resume == "never":
            return None
        path = latest_checkpoint(self.root) if resume == "auto" else find_checkpoint(Path(resume))
        if path is None:
            return None
        meta = verify_checkpoint(path)
        check_compatible(meta, self.job, path=path)
        if meta.model_path != self.job.model.path:
            log.warning(
                "checkpoint %s was trained from model.path=%s; this spec says %s (the reference "
                "policy comes from this spec's model)",
                path,
                meta.model_path,
                self.job.model.path,
            )
        return path

    def restore(self, path: Path, trainers: list[Any], sampler: Any) -> int:
        """Every trainer rank loads its state (any rank count), the data cursor goes into
        ``sampler`` and the driver's RNG is restored; return the step to continue from."""
        t0 = time.perf_counter()
        meta, driver_rng = read_checkpoint(path)
        _call_all(trainers, "load", path)
        sampler.load_state_dict(meta.data_cursor)
        set_driver_rng_state(driver_rng)
        self.last_saved = meta.step
        log.info(
            "resumed from %s: step %d, policy version %d (%.1f s)",
            path,
            meta.step,
            meta.policy_version,
            time.perf_counter() - t0,
        )
        return meta.step

    def maybe_save(self, step: int, trainers: list[Any], sampler: Any) -> Path | None:
        """Save when ``step`` (steps completed) is a multiple of ``checkpoint.every_n_steps``."""
        every = self.spec.every_n_steps
        if every and step % every == 0:
            return self.save(step, trainers, sampler)
        return None

    def finish(self, step: int, trainers: list[Any], sampler: Any, *, stopped: bool) -> Path | None:
        """The end-of-run save (``save_final``, or a requested stop); skipped if already saved."""
        if step == self.last_saved or step == 0 or not (self.spec.save_final or stopped):
            return None
        return self.save(step, trainers, sampler)

    def save(self, step: int, trainers: list[Any], sampler: Any) -> Path:
        """Write ``step_<step>`` from the trainer's current state, move ``latest``, prune."""
        t0 = time.perf_counter()
        config, tokenizer = self._model_info()
        path = write_checkpoint(
            self.root,
            step=step,
            job=self.job,
            write_trainer=lambda tmp: sorted(
                {f for files in _call_all(trainers, "save", tmp) for f in files}
            ),
            policy_version=_call_all(trainers[:1], "current_version")[0],
            data_cursor=sampler.state_dict(),
            model_config=config,
            tokenizer_dir=tokenizer,
            driver_rng=driver_rng_state(),
        )
        self.last_saved = step
        prune_checkpoints(self.root, keep_last=self.spec.keep_last)
        size = sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
        log.info(
            "checkpoint %s saved (%.1f MB in %.1f s)", path, size / 2**20, time.perf_counter() - t0
        )
        return path

    def _model_info(self) -> tuple[dict[str, Any], Path | None]:
        if self._model is None:
            from fp8rl.workers.model.loading import resolve_model

            source = resolve_model(self.job.model.path, load_weights=False)
            self._model = (source.config.to_dict(), source.tokenizer_dir)
        return self._model


# --------------------------------------------------------------------------------------------
# helpers


def _call_all(targets: list[Any], method: str, *args: Any) -> list[Any]:
    """``method(*args)`` on every target at once (Ray actors) or in turn (plain objects)."""
    fns = [getattr(t, method) for t in targets]
    if fns and hasattr(fns[0], "remote"):
        import ray

        return ray.get([fn.remote(*args) for fn in fns])
    return [fn(*args) for fn in fns]


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
    "CheckpointError",
    "CheckpointMeta",
    "Checkpointer",
    "check_compatible",
    "checkpoint_step",
    "find_checkpoint",
    "latest_checkpoint",
    "prune_checkpoints",
    "read_checkpoint",
    "read_model_weights",
    "verify_checkpoint",
    "write_checkpoint",
    "write_model_shards",
]
