"""Checks a job spec must pass before anything starts: what the schema allows but this release
does not run, a placement that does not fit the declared cluster (``services.placement``), and (on
the machine that runs the job) files and the first records of dataset files, extras, reward
functions, templates.

``fp8rl validate``, ``fp8rl run``/the driver and the REST API call ``preflight``, so a spec that
cannot run fails in a second with lines naming the field, not minutes later inside a Ray worker.
Each problem is one ``dotted.path: reason`` line (raised together as ``SpecError``).
"""

from __future__ import annotations

import difflib
import importlib.util
import os
import string
import tempfile
from pathlib import Path

from fp8rl.protocol import JobSpec, SpecError
from fp8rl.protocol.data_spec import FileDataset
from fp8rl.protocol.reward_spec import BUILTIN_REWARDS
from fp8rl.services.data.files import DatasetError, probe_file_dataset
from fp8rl.services.placement import placement_problems


def preflight(job: JobSpec, *, local: bool) -> None:
    """Raise ``SpecError`` listing every reason ``job`` cannot run.

    Args:
        local: the job runs on this machine, so files, installed extras and importable reward
            functions are checked too (the REST API checks only what does not depend on the
            machine that will run it: it never reads paths from request input).
    """
    from fp8rl.workers.reward.functions import kwargs_problems
    from fp8rl.workers.reward.isolated import regex_problems

    problems = unsupported(job) + template_problems(job) + placement_problems(job, local=local)
    term_lists = [("reward.functions", job.reward.functions)]
    term_lists += [(f"eval.rewards.{name}", terms) for name, terms in job.eval.rewards.items()]
    for prefix, terms in term_lists:
        problems += regex_problems(terms, prefix=prefix)
        problems += kwargs_problems(terms, prefix=prefix, custom=local)
    if local:
        problems += local_problems(job)
    if problems:
        raise SpecError(problems)


def unsupported(job: JobSpec) -> list[str]:
    """Options the schema accepts but this release does not implement."""
    out = []
    if job.trainer.backend == "megatron" and job.precision.quant.kv_cache_dtype != "auto":
        out.append(
            "precision.quant.kv_cache_dtype: an FP8 KV cache is not supported with "
            "trainer.backend=megatron yet; use auto"
        )
    if job.rollout.backend == "sglang" and job.precision.exact:
        out.append(
            "precision.exact: true needs fp8rl's batch-invariant kernels; rollout.backend: sglang "
            "runs SGLang's own (same FP8 codes, different kernels): set precision.exact: false"
        )
    mini = job.trainer.mini_batch_size or job.batch_size
    replicas = job.trainer.num_workers  # Megatron: only the DP replicas split a mini-batch
    if job.trainer.backend == "megatron":
        replicas //= job.trainer.tensor_parallel_size * job.trainer.pipeline_parallel_size
    if replicas > mini:
        out.append(
            f"trainer.num_workers: {replicas} data-parallel trainer replicas cannot split a "
            f"mini-batch of {mini} sequences; use at most {mini} or raise "
            "trainer.mini_batch_size"
        )
    if job.logging.mismatch_attribution_every and job.trainer.num_workers > 1:
        out.append(
            "logging.mismatch_attribution_every: needs trainer.num_workers=1 (it rebuilds the "
            "policy from rank 0's full weights); set it to 0 or use one trainer rank"
        )
    out += hybrid_problems(job)
    for i, fn in enumerate(job.reward.functions):
        if fn.name not in BUILTIN_REWARDS and "." not in fn.name and ":" not in fn.name:
            out.append(
                f"reward.functions.{i}.name: {fn.name!r} is neither a built-in "
                f"({', '.join(BUILTIN_REWARDS)}) nor a dotted path package.module.function"
            )
    return out


def hybrid_problems(job: JobSpec) -> list[str]:
    """What ``resources.hybrid_engine`` (one trainer rank and one native engine in one process)
    cannot host."""
    if not job.resources.hybrid_engine:
        return []
    needs = {
        "trainer.backend": (job.trainer.backend, "native"),
        "rollout.backend": (job.rollout.backend, "native"),
        "trainer.num_workers": (job.trainer.num_workers, 1),
        "rollout.num_workers": (job.rollout.num_workers, 1),
        "resources.weight_transport": (job.resources.weight_transport, "auto"),
        "resources.placement": (job.resources.placement, "colocated"),
    }
    return [
        f"{field}: resources.hybrid_engine runs one native trainer rank and one native engine "
        f"in one process and hands weights over in memory; got {value!r}, needs {wanted!r} "
        "(or set resources.hybrid_engine: false)"
        for field, (value, wanted) in needs.items()
        if value != wanted
    ]


def template_problems(job: JobSpec) -> list[str]:
    """``data.prompt_template`` must be a valid ``str.format`` template."""
    try:
        fields = [
            f for _, f, _, _ in string.Formatter().parse(job.data.prompt_template) if f is not None
        ]
    except ValueError as exc:
        return [
            f"data.prompt_template: not a valid format string ({exc}); write {{{{ and }}}} for literal braces"
        ]
    positional = [f for f in fields if not f or f.split(".")[0].split("[")[0].isdigit()]
    if positional:
        return [
            f"data.prompt_template: positional placeholder {{{positional[0]}}}: name a field of "
            "the row, e.g. {question} (write {{ and }} for literal braces)"
        ]
    if "question" not in {f.split(".")[0].split("[")[0] for f in fields}:
        return [
            "data.prompt_template: has no {question} placeholder, so every prompt would be the same text"
        ]
    return []


RESUME_KEYWORDS = ("auto", "never")
"""The values of ``checkpoint.resume`` that are not a path."""


def resume_problems(resume: str) -> list[str]:
    """``checkpoint.resume`` must be a keyword or an existing path (a typo such as ``atuo`` would
    otherwise fail only once the run starts, as a missing checkpoint)."""
    if resume in RESUME_KEYWORDS:
        return []
    path = Path(resume).expanduser()
    if path.exists():
        from fp8rl.services.checkpoint_manifest import UNVERIFIED

        if UNVERIFIED in path.name:
            return [
                f"checkpoint.resume: {resume!r} was moved aside for failing verification and is "
                "never resumed from; if its files were restored, rename it back to step_<N>"
            ]
        if _holds_checkpoint(path):
            return _resume_size_problems(resume, path)
        return [
            f"checkpoint.resume: {resume!r} exists but is not a checkpoint: name a step_<N> "
            "checkpoint, or a run or checkpoints directory that holds one (or use auto / never)"
        ]
    hint = difflib.get_close_matches(resume.lower(), RESUME_KEYWORDS, n=1, cutoff=0.5)
    return [
        f"checkpoint.resume: {resume!r} is neither {' nor '.join(RESUME_KEYWORDS)} nor an existing "
        f"checkpoint path{_relative_note(path)}" + (f" — did you mean {hint[0]}?" if hint else "")
    ]


def _resume_size_problems(resume: str, path: Path) -> list[str]:
    """The checkpoint ``checkpoint.resume`` names, or the one a run/checkpoints directory would
    resume from, passes the size check of its manifest (``verify_checkpoint(checksums=False)``:
    cheap, no hashing; the run itself verifies every sha256 before loading)."""
    from fp8rl.services.checkpoint_manifest import (
        CHECKPOINTS,
        META,
        CheckpointCorruptError,
        select_checkpoint,
        step_of,
        verify_checkpoint,
    )

    if step_of(path) is not None or (path / META).is_file():
        try:
            verify_checkpoint(path, checksums=False)
        except CheckpointCorruptError as error:
            return [
                f"checkpoint.resume: {resume!r} fails verification, never resumed from: {error}"
            ]
        return []
    root = path / CHECKPOINTS if (path / CHECKPOINTS).is_dir() else path
    chosen, skipped = select_checkpoint(root, checksums=False)
    if chosen is None:
        reasons = "; ".join(f"{s.path.name}: {s.reason}" for s in skipped)
        return [
            f"checkpoint.resume: {resume!r} holds no checkpoint that passes verification ({reasons})"
        ]
    return []


def _holds_checkpoint(path: Path) -> bool:
    """Whether ``path`` is a checkpoint, or a run/checkpoints directory with ``step_<N>`` in it
    (structure only; the run verifies the files)."""
    from fp8rl.services.checkpoint_manifest import CHECKPOINTS, META, checkpoint_steps, step_of

    if step_of(path) is not None or (path / META).is_file():
        return True
    root = path / CHECKPOINTS if (path / CHECKPOINTS).is_dir() else path
    return bool(checkpoint_steps(root))


def output_dir_problems(output_dir: str) -> list[str]:
    """``output_dir`` must be a directory this process can create the run directory in: tried
    by creating (and removing) an empty directory in it, or in its nearest existing parent."""
    path = Path(output_dir).expanduser()
    existing = path
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if existing.exists() and not existing.is_dir():
        return [f"output_dir: {output_dir} — {existing} is a file, not a directory"]
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".fp8rl-validate-", dir=existing))
    except OSError as exc:
        return [
            f"output_dir: {output_dir} is not writable here ({existing}: {exc.strerror}); "
            "set output_dir to a directory you can write"
        ]
    return []


def local_problems(job: JobSpec) -> list[str]:
    """Files, extras and reward functions on this machine."""
    out = resume_problems(job.checkpoint.resume) + output_dir_problems(job.output_dir)
    out += model_path_problems(job.model.path)
    out += dataset_problems(job)
    if job.rollout.backend == "vllm" and importlib.util.find_spec("vllm") is None:
        out.append(
            "rollout.backend: vllm is not installed here; install the extra "
            "(FP8RL_EXTRAS=dev,vllm bash deploy/setup.sh, or pip install '.[vllm]')"
        )
    if (
        job.rollout.backend == "sglang"
        and importlib.util.find_spec("sglang") is None
        and os.environ.get("FP8RL_SGLANG_ENGINE") != "fake"
    ):
        out.append(
            "rollout.backend: sglang is not installed here; run the SGLang image "
            "(deploy/Dockerfile.sglang, docs/sglang.md)"
        )
    if job.trainer.backend == "megatron":
        out += megatron_problems(job)
    from fp8rl.workers.reward.functions import resolve_reward_fn

    for i, fn in enumerate(job.reward.functions):
        if fn.name in BUILTIN_REWARDS or ("." not in fn.name and ":" not in fn.name):
            continue  # a built-in, or a name ``unsupported`` has reported already
        try:
            resolve_reward_fn(fn.name)
        except ValueError as exc:
            out.append(f"reward.functions.{i}.name: {exc}")
    return out


def model_path_problems(model_path: str) -> list[str]:
    """A local ``model.path`` must be what ``resolve_model`` loads: a directory with a
    ``config.json`` (Hugging Face layout) or a ``.gguf`` file (``builtin:`` and ``random:``
    names are checked when the model is built)."""
    kind, _, _ = model_path.partition(":")
    if kind in ("builtin", "random"):
        return []
    path = Path(model_path).expanduser()
    if not path.exists():
        return [
            f"model.path: {model_path} does not exist{_relative_note(path)}: name a Hugging Face "
            "model directory or a .gguf file"
        ]
    if path.is_dir() and not (path / "config.json").is_file():
        return [f"model.path: {model_path} has no config.json: not a Hugging Face model directory"]
    if path.is_file() and path.suffix != ".gguf":
        return [f"model.path: {model_path} is a file but not a .gguf; name a model directory"]
    if path.is_file():
        with open(path, "rb") as handle:
            magic = handle.read(4)
        return [] if magic == b"GGUF" else [f"model.path: {model_path} is not a GGUF file"]
    return _hf_dir_problems(model_path, path)


def _hf_dir_problems(model_path: str, path: Path) -> list[str]:
    """A Hugging Face directory's ``config.json`` builds a supported decoder and its safetensors
    exist (``load_hf_dir``'s checks, without reading the weights)."""
    import json

    from fp8rl.workers.model.config import config_from_hf
    from fp8rl.workers.model.loading import safetensors_files

    try:
        config_from_hf(json.loads((path / "config.json").read_text()))
        safetensors_files(path)
    except (ValueError, FileNotFoundError, OSError, TypeError) as exc:  # JSONDecodeError too
        return [f"model.path: {model_path}: {exc}"]
    return []


def _relative_note(path: Path) -> str:
    """`` (relative paths are from <cwd>)`` for a relative path, nothing for an absolute one."""
    return "" if path.is_absolute() else f" (relative paths are from {Path.cwd()})"


def dataset_problems(job: JobSpec) -> list[str]:
    """Dataset files of ``data.train`` and ``eval.datasets`` on this machine: each exists and its
    first records (``probe_file_dataset``: a few rows, never the whole file) are JSON objects
    with the spec's ``prompt_key`` and ``answer_key``. Hub datasets are not fetched here."""
    sets = [
        ("data.train", job.data.train),
        *((f"eval.datasets.{i}", d) for i, d in enumerate(job.eval.datasets)),
    ]
    out = []
    for where, spec in sets:
        if not isinstance(spec, FileDataset) or spec.hub:
            continue
        if not Path(spec.path).expanduser().exists():
            out.append(
                f"{where}.path: {spec.path} does not exist{_relative_note(Path(spec.path).expanduser())}"
            )
            continue
        try:
            probe_file_dataset(spec)
        except DatasetError as exc:
            out.append(f"{where}.{exc.field}: {exc}")
    return out


def _installed(module: str) -> bool:
    """Whether ``module`` can be imported (``find_spec`` of a submodule raises when its parent
    package is missing)."""
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:
        return False


def megatron_problems(job: JobSpec) -> list[str]:
    """``trainer.backend=megatron`` on this machine: the extra is installed and the model splits
    into TP × PP (heads, layers, whole 128×128 FP8 blocks per shard)."""
    if not _installed("megatron.core"):
        return [
            "trainer.backend: megatron-core is not installed here; install the extra "
            "(FP8RL_EXTRAS=dev,megatron bash deploy/setup.sh, or pip install '.[megatron]')"
        ]
    from fp8rl.workers.model.loading import resolve_model
    from fp8rl.workers.trainer.megatron.layout import model_fit_problems

    try:
        config = resolve_model(job.model.path, load_weights=False).config
    except (OSError, ValueError):
        return []  # reported by the model.path check
    t = job.trainer
    return [
        f"trainer.tensor_parallel_size: {problem}"
        for problem in model_fit_problems(
            config,
            tp=t.tensor_parallel_size,
            pp=t.pipeline_parallel_size,
            fp8=job.precision.trainer_fp8,
        )
    ]
