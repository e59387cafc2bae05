"""Checks a job spec must pass before anything starts: what the schema allows but this release
does not run, and (on the machine that runs the job) files, extras, reward functions, templates.

``fp8rl validate``, ``fp8rl run``/the driver and the REST API call ``preflight``, so a spec that
cannot run fails in a second with lines naming the field, not minutes later inside a Ray worker.
Each problem is one ``dotted.path: reason`` line (raised together as ``SpecError``).
"""

from __future__ import annotations

import importlib.util
import string
from pathlib import Path

from fp8rl.protocol import JobSpec, SpecError
from fp8rl.protocol.data_spec import FileDataset
from fp8rl.protocol.reward_spec import BUILTIN_REWARDS


def preflight(job: JobSpec, *, local: bool) -> None:
    """Raise ``SpecError`` listing every reason ``job`` cannot run.

    Args:
        local: the job runs on this machine, so files, installed extras and importable reward
            functions are checked too (the REST API checks only what does not depend on the
            machine that will run it: it never reads paths from request input).
    """
    problems = unsupported(job) + template_problems(job)
    if local:
        problems += local_problems(job)
    if problems:
        raise SpecError(problems)


def unsupported(job: JobSpec) -> list[str]:
    """Options the schema accepts but this release does not implement."""
    out = []
    if job.trainer.backend == "megatron":
        out.append("trainer.backend: megatron is not implemented yet; use native")
    if job.rollout.backend == "sglang":
        out.append("rollout.backend: sglang is not implemented yet; use native or vllm")
    mini = job.trainer.mini_batch_size or job.batch_size
    if job.trainer.num_workers > mini:
        out.append(
            f"trainer.num_workers: {job.trainer.num_workers} trainer ranks cannot split a "
            f"mini-batch of {mini} sequences; use at most {mini} ranks or raise "
            "trainer.mini_batch_size"
        )
    for i, fn in enumerate(job.reward.functions):
        if fn.name not in BUILTIN_REWARDS and "." not in fn.name and ":" not in fn.name:
            out.append(
                f"reward.functions.{i}.name: {fn.name!r} is neither a built-in "
                f"({', '.join(BUILTIN_REWARDS)}) nor a dotted path package.module.function"
            )
    return out


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
    if "question" not in {f.split(".")[0].split("[")[0] for f in fields}:
        return [
            "data.prompt_template: has no {question} placeholder, so every prompt would be the same text"
        ]
    return []


def local_problems(job: JobSpec) -> list[str]:
    """Files, extras and reward functions on this machine."""
    out = []
    kind, _, _ = job.model.path.partition(":")
    if kind not in ("builtin", "random") and not Path(job.model.path).expanduser().exists():
        out.append(
            f"model.path: {job.model.path} does not exist (a Hugging Face directory or a .gguf file)"
        )
    sets = [
        ("data.train", job.data.train),
        *((f"eval.datasets.{i}", d) for i, d in enumerate(job.eval.datasets)),
    ]
    for where, spec in sets:
        if (
            isinstance(spec, FileDataset)
            and not spec.hub
            and not Path(spec.path).expanduser().exists()
        ):
            out.append(
                f"{where}.path: {spec.path} does not exist (relative paths are from the "
                f"current directory {Path.cwd()})"
            )
    if job.rollout.backend == "vllm" and importlib.util.find_spec("vllm") is None:
        out.append(
            "rollout.backend: vllm is not installed here; install the extra "
            "(FP8RL_EXTRAS=dev,vllm bash deploy/setup.sh, or pip install '.[vllm]')"
        )
    from fp8rl.workers.reward.functions import resolve_reward_fn

    for i, fn in enumerate(job.reward.functions):
        if fn.name in BUILTIN_REWARDS:
            continue
        try:
            resolve_reward_fn(fn.name)
        except ValueError as exc:
            out.append(f"reward.functions.{i}.name: {exc}")
    return out
