"""Built-in rule-based reward functions and resolution of custom ones by dotted path.

Every reward function has one signature, ``fn(*, prompt, response, answer, **kwargs) -> float``,
so built-ins and user functions (``package.module.function`` or ``package.module:function``)
are interchangeable in ``RewardSpec.functions``. ``math`` is special: math-verify runs in a
subprocess (see ``subprocess_pool.py``), so it is resolved to ``math_verify_score`` and batched
by the worker rather than called inline.
"""

from __future__ import annotations

import difflib
import importlib
import inspect
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from fp8rl.workers.reward.isolated import compile_user_regex
from fp8rl.workers.reward.parsing import (
    extract_gsm8k_strict,
    extract_last_boxed,
    extract_last_number,
    gsm8k_gold,
    numbers_equal,
)

if TYPE_CHECKING:
    from fp8rl.protocol.reward_spec import RewardFnSpec

RewardFn = Callable[..., float]

CALL_ARGUMENTS = ("prompt", "response", "answer")
"""What the worker passes every reward function for each response (never set in ``kwargs``)."""

DEFAULT_FORMAT_PATTERN = r"\\(?:boxed|fbox)\s*\{.*\}|####\s*-?\$?\s?\d"
"""``format`` reward default: the response states a final answer (a box or a ``####`` marker)."""


def arithmetic_reward(*, prompt: str = "", response: str, answer: str, **_: Any) -> float:
    """1.0 when the response's final integer equals ``answer`` exactly, else 0.0.

    The final answer is the last ``\\boxed{}``, else the number after the last ``####``, else the
    last number in the response (small models rarely follow a format; the arithmetic task is
    fp8rl's own, see ``fp8rl.services.data.arithmetic``).
    """
    boxed = extract_last_boxed(response)
    predicted = boxed if boxed is not None else extract_gsm8k_strict(response)
    if predicted is None:
        predicted = extract_last_number(response)
    return float(numbers_equal(predicted, answer))


def gsm8k_strict_reward(*, prompt: str = "", response: str, answer: str, **_: Any) -> float:
    """GSM8K strict: 1.0 when the number after the last ``####`` equals the gold answer.

    ``answer`` may be the dataset's full solution (its text after ``####`` is the gold) or the
    bare number. Commas and ``$`` are ignored; the whole response is searched.
    """
    return float(numbers_equal(extract_gsm8k_strict(response), gsm8k_gold(answer)))


def gsm8k_flexible_reward(*, prompt: str = "", response: str, answer: str, **_: Any) -> float:
    """GSM8K flexible: 1.0 when the last number in the response equals the gold answer."""
    return float(numbers_equal(extract_last_number(response), gsm8k_gold(answer)))


def format_reward(
    *,
    prompt: str = "",
    response: str,
    answer: str = "",
    pattern: str = DEFAULT_FORMAT_PATTERN,
    **_: Any,
) -> float:
    """1.0 when ``pattern`` (an RE2 regular expression, DOTALL) is found in the response, else 0.0.

    RE2 matches in linear time (see ``isolated.py``); a pattern RE2 refuses raises ``ValueError``.
    """
    return float(compile_user_regex(pattern).search(response) is not None)


def math_verify_score(*, response: str, answer: str, **_: Any) -> float:
    """MATH-style equivalence through math-verify; call it in a subprocess (signals inside).

    The prediction is the content of the last ``\\boxed{}``/``\\fbox{}`` (nested braces) when there
    is one, else math-verify's own extraction from the whole response. The gold is parsed as
    LaTeX (``$...$`` added when absent). math-verify's internal signal timeouts are turned off:
    the caller's outer timeout bounds the time.
    """
    import logging

    from math_verify import parse, verify

    logging.getLogger("math_verify").setLevel(logging.ERROR)  # "timeout disabled" notices
    boxed = extract_last_boxed(response)
    predicted = parse(f"${boxed}$" if boxed is not None else response, parsing_timeout=None)
    gold_text = answer if "$" in answer or "\\boxed" in answer else f"${answer}$"
    gold = parse(gold_text, parsing_timeout=None)
    if not gold or not predicted:
        return 0.0
    return float(verify(gold, predicted, timeout_seconds=None))


BUILTIN_FUNCTIONS: dict[str, RewardFn] = {
    "arithmetic": arithmetic_reward,
    "gsm8k": gsm8k_strict_reward,
    "gsm8k_flexible": gsm8k_flexible_reward,
    "format": format_reward,
    "math": math_verify_score,
}
"""Reward functions by built-in name (``protocol.reward_spec.BUILTIN_REWARDS``)."""


def resolve_reward_fn(name: str) -> RewardFn:
    """A built-in by name, or a callable by ``package.module.function`` / ``package.module:function``.

    Raises ``ValueError`` naming the path when the module or attribute cannot be loaded or is
    not callable.
    """
    if name in BUILTIN_FUNCTIONS:
        return BUILTIN_FUNCTIONS[name]
    module_name, sep, attr = name.partition(":") if ":" in name else name.rpartition(".")
    if not sep or not module_name or not attr:
        raise ValueError(
            f"reward function {name!r} is neither a built-in ({', '.join(BUILTIN_FUNCTIONS)}) "
            "nor a dotted path package.module.function"
        )
    try:
        fn = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as error:
        raise ValueError(f"reward function {name!r} cannot be loaded: {error}") from error
    if not callable(fn):
        raise ValueError(f"reward function {name!r} is not callable")
    return fn


def kwargs_problems(
    terms: list[RewardFnSpec], prefix: str = "reward.functions", *, custom: bool = False
) -> list[str]:
    """``prefix.N.kwargs.KEY: reason`` for each keyword a term's function does not take.

    The built-ins swallow unknown keywords (``**_``), so a misspelt one (``patern``) would run
    silently with the default; a keyword the worker sets per response (``CALL_ARGUMENTS``)
    would clash with it. ``custom``: also resolve dotted-path functions (importing their module,
    on the machine that runs the job) and check those without a ``**kwargs`` parameter.
    """
    problems = []
    for index, term in enumerate(terms):
        fn = BUILTIN_FUNCTIONS.get(term.name)
        if fn is None and custom and ("." in term.name or ":" in term.name):
            try:
                fn = resolve_reward_fn(term.name)
            except ValueError:
                continue  # reported as the term's name
        if fn is None or not term.kwargs:
            continue
        params = inspect.signature(fn).parameters.values()
        open_ended = any(p.kind is p.VAR_KEYWORD for p in params)
        takes = [
            p.name
            for p in params
            if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD) and p.name not in CALL_ARGUMENTS
        ]
        for key in term.kwargs:
            if key in CALL_ARGUMENTS:
                why = "is set by the reward worker for each response; remove it from kwargs"
            elif key in takes or (open_ended and term.name not in BUILTIN_FUNCTIONS):
                continue
            else:
                close = difflib.get_close_matches(key, takes, n=1)
                hint = f"; did you mean {close[0]}?" if close else ""
                why = f"{term.name} takes no such argument (it takes: {', '.join(takes) or 'none'}){hint}"
            problems.append(f"{prefix}.{index}.kwargs.{key}: {why}")
    return problems
