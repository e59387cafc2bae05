"""The driver's checkpoint hooks for one run: resolve the resume point, restore, save every N
steps and at the end, prune.

The files, their atomic writes and verification are ``checkpoint`` and ``checkpoint_manifest``
(whose docstrings give the layout and the rules: the abandoned branch, ``keep_last``, checkpoints
that fail verification moved aside); this module is the policy the driver calls.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

from fp8rl.protocol import JobSpec
from fp8rl.services.checkpoint import (
    driver_rng_state,
    find_checkpoint,
    latest_pointer,
    point_latest,
    read_checkpoint,
    remove_interrupted_saves,
    set_driver_rng_state,
    write_checkpoint,
)
from fp8rl.services.checkpoint_manifest import (
    CHECKPOINTS,
    LATEST,
    Pruned,
    Skipped,
    VerifiedCheckpoints,
    check_compatible,
    checkpoint_steps,
    prune_checkpoints,
    read_meta,
    select_checkpoint,
    set_aside_unverified,
    step_of,
    warn_skipped,
)
from fp8rl.services.checkpoint_verify import CheckpointCorruptError

log = logging.getLogger("fp8rl.services.checkpoint")  # one logger for the checkpoint modules


class Checkpointer:
    """The driver's checkpoint hooks for one run directory.

    ``trainers`` arguments are the trainer ranks: TrainerBackend actor handles (``save`` /
    ``load`` / ``current_version``) or, in tests, plain objects with those methods.

    ``skipped``: the checkpoints ``resolve`` passed over, with their reasons. ``anchor``: the
    newest verified, healthy checkpoint of this run directory (the resume point, then the newest
    healthy save), which pruning never deletes; None until known.

    Every checkpoint this object verifies or writes is remembered (``VerifiedCheckpoints``), so
    the pruning after each save hashes a checkpoint at most once per run.
    """

    def __init__(self, run_dir: Path, job: JobSpec) -> None:
        self.root, self.job, self.spec = run_dir / CHECKPOINTS, job, job.checkpoint
        self.last_saved: int | None = None
        self.skipped: list[Skipped] = []
        self.anchor: Path | None = None
        self._verified = VerifiedCheckpoints()
        self._model: tuple[dict[str, Any], Path | None] | None = None
        removed = remove_interrupted_saves(self.root)
        if removed:
            log.warning("removed %d interrupted checkpoint save(s) in %s", len(removed), self.root)

    def resolve(self) -> Path | None:
        """The checkpoint to resume from per ``checkpoint.resume``, verified and checked against
        the spec. With ``auto``, checkpoints that fail verification or are unhealthy are skipped
        (logged with path and reason) in favour of the newest verified healthy one.

        Once the resume point is accepted (and only then: a refused resume changes nothing), the
        checkpoints of this run directory newer than it — the abandoned branch — are settled:
        those failing verification are moved aside (``set_aside_unverified``), the verified ones
        stay until this run saves their step again (warned). See the module docstring.

        Raises:
            CheckpointError: ``resume`` is a path without a usable checkpoint, or the checkpoint
                is under another quant contract.
            CheckpointCorruptError: ``resume`` names a checkpoint that fails verification.
        """
        resume = self.spec.resume
        if resume == "never":
            return None
        if resume == "auto":
            t0 = time.perf_counter()
            path, self.skipped = select_checkpoint(self.root, verify=self._verified.verify)
            warn_skipped(self.skipped)
            if path is None and any(skip.corrupt for skip in self.skipped):
                # Starting over would move this run (and its damaged checkpoints) aside and may
                # prune older runs: refuse and touch nothing; the person decides.
                raise CheckpointCorruptError(
                    f"checkpoint.resume=auto: no checkpoint under {self.root} passes "
                    f"verification ({'; '.join(f'{s.path.name}: {s.reason}' for s in self.skipped)})"
                    "; nothing was changed. Restore the files, name a checkpoint in "
                    "checkpoint.resume, or set checkpoint.resume=never to start over"
                )
            if path is not None:
                log.info("verified %s in %.1f s", path, time.perf_counter() - t0)
        else:
            path = find_checkpoint(Path(resume))
            self._verified.remember(path)  # find_checkpoint hashed it just now
        if path is None:
            if self.skipped:
                log.warning("no verified healthy checkpoint in %s: starting over", self.root)
            return None
        meta = read_meta(path)
        check_compatible(meta, self.job, path=path)
        if not meta.healthy:  # only reachable by naming it in checkpoint.resume
            log.warning("resuming from %s, which is marked healthy: false", path)
        if meta.model_path != self.job.model.path:
            log.warning(
                "checkpoint %s was trained from model.path=%s; this spec says %s (the reference "
                "policy comes from this spec's model)",
                path,
                meta.model_path,
                self.job.model.path,
            )
        if path.resolve().parent == self.root.resolve():
            self._settle_abandoned_branch(self.root / path.name, meta.step)
        return path

    def _settle_abandoned_branch(self, resume_point: Path, step: int) -> None:
        """Move aside the checkpoints newer than ``resume_point`` that fail verification; warn
        about the verified ones (replaced when this run saves their step)."""
        self.anchor = resume_point
        if self.spec.resume != "auto":  # auto verified them already (``self.skipped``)
            for newer in [s for s in checkpoint_steps(self.root) if s > step][::-1]:
                path = self.root / f"step_{newer}"
                try:
                    self._verified.verify(path)
                    self.skipped.append(Skipped(path, "newer than the resume point", False))
                except CheckpointCorruptError as error:
                    reason = str(error).removeprefix(f"{path}: ")
                    self.skipped.append(Skipped(path, reason, corrupt=True))
        for skip in self.skipped:
            if skip.corrupt:
                set_aside_unverified(skip.path, reason=skip.reason)
            else:
                log.warning(
                    "checkpoint %s is newer than the resume point %s (an abandoned branch): it "
                    "stays until this run saves step %d again, which replaces it",
                    skip.path,
                    resume_point.name,
                    step_of(skip.path),
                )
        if not (
            self.root / (latest_pointer(self.root) or LATEST)
        ).is_dir():  # it named one moved aside
            point_latest(self.root, resume_point)

    def restore(self, path: Path, trainers: list[Any], sampler: Any) -> int:
        """Every trainer rank loads its state (any rank count: DCP reshards), the data cursor goes
        into ``sampler`` and the driver's RNG is restored; return the step to continue from.

        Raises:
            CheckpointCorruptError: the checkpoint fails verification (skipped when ``resolve``
                verified it moments ago) or a file cannot be decoded.
        """
        t0 = time.perf_counter()
        meta, driver_rng = read_checkpoint(path, checksums=Path(path) not in self._verified)
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

    def maybe_save(
        self, step: int, trainers: list[Any], sampler: Any, *, healthy: bool = True
    ) -> Path | None:
        """Save when ``step`` (steps completed) is a multiple of ``checkpoint.every_n_steps``."""
        every = self.spec.every_n_steps
        if every and step % every == 0:
            return self.save(step, trainers, sampler, healthy=healthy)
        return None

    def finish(
        self, step: int, trainers: list[Any], sampler: Any, *, stopped: bool, healthy: bool = True
    ) -> Path | None:
        """The end-of-run save (``save_final``, or a requested stop); skipped if already saved."""
        if step == self.last_saved or step == 0 or not (self.spec.save_final or stopped):
            return None
        return self.save(step, trainers, sampler, healthy=healthy)

    def save(self, step: int, trainers: list[Any], sampler: Any, *, healthy: bool = True) -> Path:
        """Write ``step_<step>`` from the trainer's current state, then prune.

        ``healthy``: False when ``step`` is after the run's last healthy step (the driver's
        health guard decides): recorded in the manifest; such a checkpoint never becomes the
        resume point, ``latest`` and the anchor stay on the last healthy one.

        An existing ``step_<step>`` is replaced atomically if it verifies (a checkpoint of an
        abandoned branch); one that fails verification is moved aside first, never overwritten.
        Pruning then keeps the newest ``keep_last`` verified checkpoints and the anchor
        (``prune_checkpoints``), reusing this run's verification results.
        """
        t0 = time.perf_counter()
        existing = self.root / f"step_{step}"
        if existing.is_dir():
            try:
                self._verified.verify(existing)  # hashed at most once per run
            except CheckpointCorruptError as error:
                set_aside_unverified(existing, reason=str(error).removeprefix(f"{existing}: "))
        config, tokenizer = self._model_info()
        path = write_checkpoint(
            self.root,
            step=step,
            job=self.job,
            write_trainer=lambda tmp: sorted(
                {
                    f
                    for files in _call_all(
                        trainers,
                        "save",
                        tmp,
                        self.spec.save_optimizer,
                        self.spec.weights_dtype,
                    )
                    for f in files
                }
            ),
            policy_version=_call_all(trainers[:1], "current_version")[0],
            data_cursor=sampler.state_dict(),
            model_config=config,
            tokenizer_dir=tokenizer,
            driver_rng=driver_rng_state(),
            healthy=healthy,
        )
        self.last_saved = step
        self._verified.remember(path)  # hashed from the bytes on disk just now: verified
        if healthy:
            self.anchor = path
        elif self.anchor == path:  # an unhealthy rewrite of the anchor's step replaced it
            self.anchor = None
        pruned = self._prune()
        size = sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
        log.info(
            "checkpoint %s saved%s (%.1f MB in %.1f s; pruned %s)",
            path,
            "" if healthy else " as unhealthy",
            size / 2**20,
            time.perf_counter() - t0,
            ", ".join(p.name for p in pruned.deleted) or "none",
        )
        return path

    def latest(self) -> Path | None:
        """The newest verified healthy checkpoint of this run directory, from the verification
        results this run already has (hashes only checkpoints it never verified or wrote)."""
        return select_checkpoint(self.root, verify=self._verified.verify)[0]

    def _prune(self) -> Pruned:
        """``prune_checkpoints`` on this run's verification results; ``latest`` follows."""
        pruned = prune_checkpoints(
            self.root,
            keep_last=self.spec.keep_last,
            anchor=self.anchor,
            verify=self._verified.verify,
        )
        self.anchor = pruned.anchor
        if self.anchor is not None and latest_pointer(self.root) != self.anchor.name:
            point_latest(self.root, self.anchor)  # it named a damaged or pruned one
        return pruned

    def _model_info(self) -> tuple[dict[str, Any], Path | None]:
        if self._model is None:
            from fp8rl.workers.model.loading import resolve_model

            source = resolve_model(self.job.model.path, load_weights=False)
            self._model = (source.config.to_dict(), source.tokenizer_dir)
        return self._model


def _call_all(targets: list[Any], method: str, *args: Any) -> list[Any]:
    """``method(*args)`` on every target at once (Ray actors) or in turn (plain objects)."""
    fns = [getattr(t, method) for t in targets]
    if fns and hasattr(fns[0], "remote"):
        import ray

        return ray.get([fn.remote(*args) for fn in fns])
    return [fn(*args) for fn in fns]
