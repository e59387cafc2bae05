"""Load a JobSpec from YAML with dotted ``key=value`` overrides; errors name the field path.

``load_job_spec("job.yaml", ["rollout.max_tokens=512"])`` reads the file, applies the overrides
(values parsed as YAML: ``5`` is an int, ``true`` a bool, ``[1, 2]`` a list) and validates. Any
problem raises ``SpecError`` whose lines read like
``rollout.max_tokns: unknown field — did you mean max_tokens?``.
"""

from __future__ import annotations

import difflib
import math
import re
import types
import typing
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from fp8rl.protocol.base import ERRORS_SHOWING_INPUT, UNION_TAGS
from fp8rl.protocol.job import JobSpec
from fp8rl.protocol.limits import LimitError, check_data_limits, load_yaml_bounded


class SpecError(ValueError):
    """A job spec that cannot be used; ``problems`` holds one human-readable line per problem."""

    def __init__(self, problems: Sequence[str], source: str = "job spec") -> None:
        self.problems = list(problems)
        self.source = source
        super().__init__(f"invalid {source}:\n" + "\n".join(f"  {p}" for p in self.problems))


def load_job_spec(path: str | Path, overrides: Iterable[str] = ()) -> JobSpec:
    """Read a YAML JobSpec, apply ``key=value`` overrides and validate.

    Raises:
        SpecError: unreadable file, malformed YAML or override, or invalid fields (each named).
    """
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise SpecError([f"cannot read {path}: {exc.strerror or exc}"], str(path)) from None
    except UnicodeDecodeError as exc:
        raise SpecError(
            [f"{path} is not UTF-8 text (byte {exc.start}): a spec is a YAML file"], str(path)
        ) from None
    return parse_job_spec(text, overrides, source=str(path), allow_empty=False)


def parse_job_spec(
    text: str,
    overrides: Iterable[str] = (),
    *,
    source: str = "job spec",
    allow_empty: bool = True,
) -> JobSpec:
    """Like ``load_job_spec`` but from YAML text.

    ``allow_empty=False`` (a spec file) refuses a document with no fields (empty, or only
    comments): every field has a default, so it would otherwise run the defaults silently.
    """
    try:
        data = load_yaml_bounded(text, _UniqueKeyLoader)
    except LimitError as exc:
        raise SpecError([f"(document): refused, {exc}"], source) from None
    except yaml.YAMLError as exc:
        raise SpecError(
            [f"not valid YAML: {exc}".replace("<unicode string>", source)], source
        ) from None
    if data is None or data == {}:
        if not allow_empty:
            raise SpecError(
                [
                    f"{source} has no fields (it is empty or only comments): nothing would be "
                    "checked and every default would run; write the fields to use (start from "
                    "deploy/jobs/quickstart.yaml)"
                ],
                source,
            )
        data = {}
    if not isinstance(data, dict):
        raise SpecError([f"top level must be a mapping, got {type(data).__name__}"], source)
    applied = []
    for item in overrides:
        try:
            apply_override(data, item)
        except SpecError as exc:
            lines = [
                p if p.startswith("override ") else f"override {item!r}: {p}" for p in exc.problems
            ]
            raise SpecError(lines, f"override of {source}") from None
        applied.append(item)
    return validate_job_spec(data, source=source, overrides=applied)


class _UniqueKeyLoader(yaml.SafeLoader):
    """SafeLoader that refuses a key given twice in one mapping (PyYAML keeps the last silently)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"key {key!r} appears twice in one mapping", key_node.start_mark
                )
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


_NUMBER = re.compile(r"^[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?$")


def _parse_value(raw: str) -> Any:
    """An override value: YAML scalars/lists/mappings, and numbers like ``1e-5`` that YAML 1.1
    would keep as text."""
    if _NUMBER.match(raw.strip()):
        text = raw.strip()
        return int(text) if re.fullmatch(r"[+-]?\d+", text) else float(text)
    try:
        return load_yaml_bounded(raw) if raw.strip() else ""
    except LimitError as exc:
        raise SpecError([f"override value refused: {exc}"]) from None
    except yaml.YAMLError:
        return raw


def validate_job_spec(
    data: dict[str, Any], *, source: str = "job spec", overrides: Sequence[str] = ()
) -> JobSpec:
    """Validate a plain dict as a JobSpec, converting pydantic errors into ``SpecError``.

    Data deeper than ``limits.MAX_DEPTH`` or larger than ``limits.MAX_NODES`` is refused first.
    ``overrides``: the ``key=value`` items applied to ``data``; a problem at a field one of them
    set names it (``(set by override 'rollout.max_tokns=5')``), and when every problem comes from
    overrides the message says so instead of blaming ``source``.
    """
    try:
        check_data_limits(data)
    except LimitError as exc:
        raise SpecError([f"(document): refused, {exc}"], source) from None
    try:
        job = JobSpec.model_validate(data)
    except ValidationError as exc:
        lines = describe_errors(exc, data, JobSpec)
        if lines and all(_override_of(line, overrides) for line in lines):
            source = f"override of {source}"
        raise SpecError(blame_overrides(lines, overrides), source) from None
    lines = [f"{path}: must be a finite number, got {value}" for path, value in _non_finite(job)]
    if lines:  # trainer.lr=inf would pass and poison the first update
        if all(_override_of(line, overrides) for line in lines):
            source = f"override of {source}"
        raise SpecError(blame_overrides(lines, overrides), source)
    return job


def _non_finite(value: Any, path: str = "") -> list[tuple[str, float]]:
    """(dotted path, value) of every inf/nan float in a spec (messages may carry NaN on
    purpose, e.g. a NaN reward the health guard must see; a spec never should)."""
    if isinstance(value, BaseModel):
        value = {name: getattr(value, name) for name in type(value).model_fields}
    if isinstance(value, dict):
        return [
            hit
            for key, item in value.items()
            for hit in _non_finite(item, f"{path}.{key}" if path else str(key))
        ]
    if isinstance(value, list | tuple):
        return [hit for i, item in enumerate(value) for hit in _non_finite(item, f"{path}.{i}")]
    if isinstance(value, float) and not math.isfinite(value):
        return [(path, value)]
    return []


def blame_overrides(problems: Sequence[str], overrides: Sequence[str]) -> list[str]:
    """``dotted.path: reason`` lines, each about a field an override set ending with
    ``(set by override 'key=value')``; the others unchanged."""
    out = []
    for line in problems:
        item = _override_of(line, overrides)
        out.append(line if item is None else f"{line} (set by override {item!r})")
    return out


def _override_of(line: str, overrides: Sequence[str]) -> str | None:
    """The last override that set the field ``line`` (``dotted.path: reason``) is about, or one
    of its sub-fields / parents."""
    dotted = line.split(":", 1)[0]
    for item in reversed(overrides):
        key = item.partition("=")[0].strip()
        if key == dotted or key.startswith(dotted + ".") or dotted.startswith(key + "."):
            return item
    return None


def apply_override(data: dict[str, Any], item: str) -> None:
    """Set ``a.b.c=value`` in the nested dict ``data`` (list elements by index: ``a.0.b=1``).

    Raises:
        SpecError: the override has no ``=`` or walks through a non-container value.
    """
    key, sep, raw = item.partition("=")
    if not sep or not key.strip():
        raise SpecError(
            [f"override {item!r} must look like key=value (e.g. rollout.max_tokens=512)"]
        )
    value = _parse_value(raw)
    parts = key.strip().split(".")
    node: Any = data
    for depth, part in enumerate(parts[:-1]):
        where = ".".join(parts[: depth + 1])
        if isinstance(node, list):
            node = _list_item(node, part, where)
            continue
        if not isinstance(node, dict):
            raise _not_a_section(key, ".".join(parts[:depth]), node)
        child = node.get(part)
        if child is None:
            child = node[part] = {}
        node = child
    last = parts[-1]
    if isinstance(node, list):
        node[_index(last, key, len(node))] = value
    elif isinstance(node, dict):
        node[last] = value
    else:
        raise _not_a_section(key, ".".join(parts[:-1]), node)


def _not_a_section(key: str, parent: str, value: Any) -> SpecError:
    """``rollout.n.x=3``: ``rollout.n`` holds a value, so nothing can be set inside it."""
    return SpecError([f"{key}: {parent} is a value ({value!r}), not a section with fields"])


def _index(part: str, where: str, length: int) -> int:
    if not part.isdigit() or int(part) >= length:
        raise SpecError([f"{where}: list index must be in 0..{length - 1}, got {part!r}"])
    return int(part)


def _list_item(node: list[Any], part: str, where: str) -> Any:
    return node[_index(part, where, len(node))]


def describe_errors(exc: ValidationError, data: Any, model: type[BaseModel]) -> list[str]:
    """One line per pydantic error: ``dotted.path: reason`` (with did-you-mean for unknown keys)."""
    lines = []
    for err in exc.errors(include_url=False):
        loc = tuple(err["loc"])
        path = _data_path(loc, data)
        dotted = ".".join(str(p) for p in path) or "job spec"
        if err["type"] == "extra_forbidden":
            allowed = _allowed_fields(loc[:-1], model)
            hint = difflib.get_close_matches(str(loc[-1]), allowed, n=1, cutoff=0.6)
            msg = "unknown field"
            if hint:
                msg += f" — did you mean {hint[0]}?"
            elif allowed:
                msg += f" — valid fields: {', '.join(sorted(allowed))}"
            lines.append(f"{dotted}: {msg}")
            continue
        if err["type"] == "union_tag_invalid":
            ctx = err.get("ctx", {})
            tag = ctx.get("tag")
            given = err.get("input")
            key = (
                next((k for k, v in given.items() if v == tag), None)
                if isinstance(given, dict)
                else None
            )
            where = f"{dotted}.{key}" if key else dotted
            lines.append(
                f"{where}: unknown kind {tag!r}; expected one of {ctx.get('expected_tags')}"
            )
            continue
        if err["type"] in ("model_type", "dict_type"):  # "... valid dictionary or instance of X"
            lines.append(f"{dotted}: expected a mapping, got {err.get('input')!r}")
            continue
        msg = err["msg"]
        if msg.startswith("Value error, "):
            msg = msg[len("Value error, ") :]
        given = err.get("input")
        shows_input = err["type"] == "missing" or err["type"] in ERRORS_SHOWING_INPUT
        if not shows_input and path and not isinstance(given, dict | list):
            msg += f" (got {given!r})"
        lines.append(f"{dotted}: {msg}")
    return lines


def _data_path(loc: tuple[Any, ...], data: Any) -> list[Any]:
    """Drop the union tags pydantic inserts into ``loc``: keep only steps that exist in ``data``."""
    path, node = [], data
    for part in loc:
        if (isinstance(node, dict) and part in node) or (
            isinstance(node, list) and isinstance(part, int) and part < len(node)
        ):
            path.append(part)
            node = node[part]
        elif not (isinstance(part, str) and part in UNION_TAGS):
            path.append(part)  # a missing field, or a step below a non-mapping value
            node = None
        # else: a union tag pydantic inserts between a field and the variant's fields
    return path


def _allowed_fields(loc: tuple[Any, ...], model: type[BaseModel]) -> list[str]:
    """Field names of the model found by walking ``loc`` from ``model`` (union tags included)."""
    candidates: list[Any] = [model]
    for part in loc:
        nxt: list[Any] = []
        for cand in candidates:
            for cls in _models_in(cand):
                if isinstance(part, str) and part in cls.model_fields:
                    nxt.append(cls.model_fields[part].annotation)
                elif isinstance(part, str) and _tag_of(cls) == part:
                    nxt.append(cls)
            if isinstance(part, int):
                nxt.extend(_list_items(cand))
        candidates = nxt
        if not candidates:
            return []
    names: list[str] = []
    for cand in candidates:
        for cls in _models_in(cand):
            names.extend(cls.model_fields)
    return sorted(set(names))


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        return _models_in(typing.get_args(annotation)[0])
    if origin in (typing.Union, types.UnionType):
        return [m for arg in typing.get_args(annotation) for m in _models_in(arg)]
    return []


def _list_items(annotation: Any) -> list[Any]:
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        return _list_items(typing.get_args(annotation)[0])
    if origin in (list, tuple):
        return list(typing.get_args(annotation)[:1])
    if origin in (typing.Union, types.UnionType):
        return [i for arg in typing.get_args(annotation) for i in _list_items(arg)]
    return []


def _tag_of(cls: type[BaseModel]) -> str | None:
    for key in ("backend", "type"):
        field = cls.model_fields.get(key)
        if field is not None and isinstance(field.default, str):
            return field.default
    return None
