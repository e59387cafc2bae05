"""Bounded reward calls: user regular expressions on RE2, user functions in killable children.

Regular expressions from a spec (the ``format`` reward's ``pattern``) run on Google's RE2
(``google-re2``): matching is linear in the text, so a pattern like ``(.+)+#`` cannot backtrack
catastrophically; no timeout is needed and none can be missed. Why RE2 rather than ``regex`` with
a timeout: ``regex`` checks its timeout only now and then (a 0.2 s timeout was seen to return after
1.2 s under load) and still burns the CPU until then; RE2 refuses what it cannot bound
(backreferences, lookaround) when the spec is checked, naming the field.

Custom reward functions (``package.module.function``) run in ``SubprocessPool`` children: each
call is bounded by ``reward.timeout_s`` of wall time, and a hung child is killed and replaced, so
the step goes on. Built-in rule rewards run inline: they are linear-time string code.
"""

from __future__ import annotations

import functools
import sys
from typing import Any

from fp8rl.protocol.reward_spec import BUILTIN_REWARDS, RewardFnSpec, RewardSpec
from fp8rl.workers.reward.subprocess_pool import SubprocessPool

PATTERN_KWARGS = ("pattern",)
"""Reward kwargs that hold a user regular expression."""


@functools.lru_cache(maxsize=64)
def compile_user_regex(pattern: str, *, dotall: bool = True) -> Any:
    """``pattern`` compiled with RE2 (``(?s)`` when ``dotall``), cached.

    Raises:
        ValueError: RE2 cannot compile it (invalid, or a backreference/lookaround RE2 refuses).
    """
    import re2

    try:
        return re2.compile(("(?s)" if dotall else "") + pattern)
    except re2.error as exc:
        reason = exc.args[0].decode() if exc.args and isinstance(exc.args[0], bytes) else exc
        raise ValueError(
            f"pattern {pattern!r} is not a linear-time (RE2) regular expression: {reason}"
        ) from None


def regex_problems(terms: list[RewardFnSpec], prefix: str = "reward.functions") -> list[str]:
    """``prefix.N.kwargs.pattern: reason`` for each user pattern RE2 refuses."""
    problems = []
    for index, term in enumerate(terms):
        for key in PATTERN_KWARGS:
            value = term.kwargs.get(key)
            if value is None:
                continue
            if not isinstance(value, str):
                problems.append(f"{prefix}.{index}.kwargs.{key}: must be a string")
                continue
            try:
                compile_user_regex(value)
            except ValueError as exc:
                problems.append(f"{prefix}.{index}.kwargs.{key}: {exc}")
    return problems


def child_target(name: str) -> str:
    """``package.module:function`` for the child process from either spelling of ``name``."""
    if ":" in name:
        return name
    module, _, attr = name.rpartition(".")
    return f"{module}:{attr}"


def is_custom(name: str) -> bool:
    """A reward function that is user code (runs in a child process)."""
    return name not in BUILTIN_REWARDS


def custom_pool(name: str, spec: RewardSpec) -> SubprocessPool:
    """Children serving the custom function ``name``, each call bounded by ``spec.timeout_s``.

    The children import with this process's ``sys.path``, so they find what it finds.
    """
    return SubprocessPool(
        child_target(name),
        num_processes=spec.verifier_processes,
        timeout_s=spec.timeout_s,
        pythonpath=[p for p in sys.path if p],
    )
