"""Server-side policy for specs that arrive over the API (the CLI run locally is not limited).

Whoever holds the API token may start jobs, but a job must not make the server (or the cluster
acting for it) read arbitrary files or call arbitrary URLs. A spec sent to ``POST /runs`` may use:

- ``model.path``: ``builtin:``/``random:`` models, or an absolute path under an allowed root;
- dataset paths (``data.train``, ``eval.datasets``): absolute paths under an allowed root, or hub
  names (``hub: true``, fetched from the Hugging Face hub, never read from disk);
- reward functions (``reward.functions``, ``eval.rewards``): the built-ins, or ``module:function``
  / ``module.function`` under an allowed module prefix;
- ``reward.remote.url``: only URLs starting with an allowed prefix.

Defaults (``SpecPolicy()`` with the server's data directory as the one root): the data directory
and the built-in rewards only, no remote reward. Operators widen it with ``fp8rl serve
--allow-path/--allow-reward-module/--allow-reward-url`` (Helm: ``api.policy``).
"""

from __future__ import annotations

import os
from pathlib import Path

from pydantic import Field

from fp8rl.protocol import JobSpec
from fp8rl.protocol.base import StrictModel
from fp8rl.protocol.reward_spec import BUILTIN_REWARDS, RewardFnSpec

MODEL_SCHEMES = ("builtin:", "random:")
"""``model.path`` values that name no file (always allowed)."""


class SpecPolicy(StrictModel):
    """What an API spec may name. Empty lists mean: nothing beyond the defaults."""

    allowed_paths: list[Path] = Field(default_factory=list)
    """Roots (absolute) under which model and dataset paths may lie, besides the data directory."""

    reward_modules: list[str] = Field(default_factory=list)
    """Module prefixes (``mylab.rewards``) whose functions API specs may use as rewards."""

    remote_reward_prefixes: list[str] = Field(default_factory=list)
    """URL prefixes (``http://rm.internal:8080/``) that ``reward.remote.url`` may start with."""


def policy_problems(job: JobSpec, policy: SpecPolicy, data_dir: Path) -> list[str]:
    """One ``field.path: reason`` line per thing in ``job`` that ``policy`` does not allow."""
    roots = [
        Path(os.path.realpath(data_dir)),
        *(Path(os.path.realpath(p)) for p in policy.allowed_paths),
    ]
    problems = []
    model = job.model.path
    if not model.startswith(MODEL_SCHEMES):
        problems += _path_problem("model.path", model, roots)
    datasets = [("data.train", job.data.train)]
    datasets += [(f"eval.datasets.{i}", d) for i, d in enumerate(job.eval.datasets)]
    for where, dataset in datasets:
        if getattr(dataset, "type", None) == "file" and not dataset.hub:
            problems += _path_problem(f"{where}.path", dataset.path, roots)
    terms = [(f"reward.functions.{i}", t) for i, t in enumerate(job.reward.functions)]
    terms += [
        (f"eval.rewards.{name}.{i}", t)
        for name, ts in job.eval.rewards.items()
        for i, t in enumerate(ts)
    ]
    for where, term in terms:
        problems += _reward_problem(f"{where}.name", term, policy.reward_modules)
    if job.reward.remote is not None:
        url = job.reward.remote.url
        if not any(url.startswith(p) for p in policy.remote_reward_prefixes):
            allowed = policy.remote_reward_prefixes or "none (fp8rl serve --allow-reward-url)"
            problems.append(
                f"reward.remote.url: {url!r} is not under an allowed URL prefix; allowed: {allowed}"
            )
    return problems


def _path_problem(where: str, value: str, roots: list[Path]) -> list[str]:
    shown = ", ".join(str(r) for r in roots)
    if not os.path.isabs(value):
        return [
            f"{where}: the API needs an absolute path under an allowed root ({shown}); got {value!r}"
        ]
    real = Path(os.path.realpath(value))  # `..` and symlinks cannot leave the root
    if any(real == root or root in real.parents for root in roots):
        return []
    return [f"{where}: {value!r} is outside the allowed roots ({shown}; fp8rl serve --allow-path)"]


def _reward_problem(where: str, term: RewardFnSpec, modules: list[str]) -> list[str]:
    if term.name in BUILTIN_REWARDS:
        return []
    module = term.name.partition(":")[0] if ":" in term.name else term.name.rpartition(".")[0]
    if any(module == m or module.startswith(m + ".") for m in modules):
        return []
    allowed = modules or "none (fp8rl serve --allow-reward-module)"
    return [
        f"{where}: reward function {term.name!r} is neither built-in {list(BUILTIN_REWARDS)} "
        f"nor in an allowed module; allowed modules: {allowed}"
    ]
