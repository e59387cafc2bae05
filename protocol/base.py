"""Base class of every fp8rl protocol model.

Every spec and message is a pydantic v2 model that refuses unknown keys (``extra="forbid"``: a
typo never silently becomes a default) and takes each field's description from the docstring
written under it (``use_attribute_docstrings``), so the docs, the JSON schema and the error
messages all come from one place.

Two holes of pydantic's lax mode are closed here, once for every model, rather than per field:

- a boolean where a number is expected (``steps: true`` would be ``steps=1``) is refused, also
  inside lists, tuples and dicts of numbers; strict mode would do it too but would also refuse
  the string-to-enum coercion YAML specs rely on;
- a discriminated union (``tagged_union``) given a scalar (``rollout: 5``) says a mapping is
  expected instead of pydantic's ``Unable to extract tag using discriminator``.
"""

from __future__ import annotations

import functools
import types
import typing
from typing import Annotated, Any, ClassVar, Union

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Discriminator,
    Tag,
    ValidationInfo,
    field_validator,
)
from pydantic_core import PydanticCustomError

BOOL_NOT_NUMBER = "bool_not_number"
"""Error type of a boolean given for a number (its message shows the value)."""

MAPPING_EXPECTED = "mapping_expected"
"""Error type of a scalar or list given for a ``tagged_union`` (its message shows the value)."""

ERRORS_SHOWING_INPUT = frozenset({BOOL_NOT_NUMBER, MAPPING_EXPECTED})
"""Error types whose message already names the input (error formatters add no ``(got …)``)."""


class StrictModel(BaseModel):
    """A pydantic model with unknown keys forbidden and field docstrings as descriptions.

    A boolean given for an ``int`` or ``float`` field (or an item of a list/tuple/dict of them)
    is refused with the error type ``BOOL_NOT_NUMBER``.
    """

    scan_items_for_bools: ClassVar[bool] = True
    """Whether list/tuple/dict items are checked too (``MessageModel`` skips it)."""

    model_config = ConfigDict(
        extra="forbid",
        use_attribute_docstrings=True,
        validate_assignment=True,
        protected_namespaces=(),
        coerce_numbers_to_str=True,  # name=123 from an override is the string "123"
    )

    @field_validator("*", mode="before")
    @classmethod
    def _refuse_bool_as_number(cls, value: Any, info: ValidationInfo) -> Any:
        if type(value) is bool:
            scalar, _ = _number_fields(cls).get(info.field_name, (None, None))
            if scalar:
                raise _bool_error(scalar, value)
        elif cls.scan_items_for_bools and isinstance(value, list | tuple | dict):
            _, item = _number_fields(cls).get(info.field_name, (None, None))
            entries = value.values() if isinstance(value, dict) else value
            if item and bool in set(map(type, entries)):  # C speed: token ids, logprobs
                pairs = value.items() if isinstance(value, dict) else enumerate(value)
                where, entry = next((k, v) for k, v in pairs if type(v) is bool)
                raise _bool_error(item, entry, where)
        return value


class MessageModel(StrictModel):
    """A ``StrictModel`` that code builds, not a user: a message between driver and workers.

    Its list items are not scanned for booleans (a rollout's token ids and logprobs run to
    thousands of items per sample; the scan tripled a 4K-token ``RolloutSample``'s validation);
    a boolean for a number field itself is still refused.
    """

    scan_items_for_bools: ClassVar[bool] = False


def _bool_error(kind: str, value: bool, where: object = None) -> PydanticCustomError:
    at = "" if where is None else f" at {'key' if isinstance(where, str) else 'index'} {where!r}"
    return PydanticCustomError(
        BOOL_NOT_NUMBER,
        "expected {kind}{at}, got a boolean ({value})",
        {"kind": kind, "at": at, "value": "true" if value else "false"},
    )


@functools.cache
def _number_fields(cls: type[BaseModel]) -> dict[str, tuple[str | None, str | None]]:
    """Per field of ``cls`` that takes numbers but no booleans: (what the field itself expects,
    what its list/tuple/dict items expect), each ``"an integer"``, ``"a number"`` or None."""
    out = {}
    for name, field in cls.model_fields.items():
        scalar = _number_kind(_leaves(field.annotation))
        item = _number_kind(
            [leaf for arg in _container_items(field.annotation) for leaf in _leaves(arg)]
        )
        if scalar or item:
            out[name] = (scalar, item)
    return out


def _leaves(annotation: Any) -> list[Any]:
    """The alternatives of an annotation, through ``Annotated``, ``Optional`` and unions."""
    origin = typing.get_origin(annotation)
    if origin is Annotated:
        return _leaves(typing.get_args(annotation)[0])
    if origin in (Union, types.UnionType):
        return [leaf for arg in typing.get_args(annotation) for leaf in _leaves(arg)]
    return [annotation]


def _container_items(annotation: Any) -> list[Any]:
    """Item annotations of the list/tuple/set/dict alternatives of ``annotation`` (dict values)."""
    items = []
    for leaf in _leaves(annotation):
        origin, args = typing.get_origin(leaf), typing.get_args(leaf)
        if origin in (list, tuple, set, frozenset):
            items.extend(arg for arg in args if arg is not Ellipsis)
        elif origin is dict and len(args) == 2:
            items.append(args[1])
    return items


def _number_kind(leaves: list[Any]) -> str | None:
    if bool in leaves:
        return None  # the field takes booleans on purpose
    if float in leaves:
        return "a number"
    if int in leaves:
        return "an integer"
    return None


UNION_TAGS: set[str] = set()
"""Every tag value used by ``tagged_union`` (error paths drop them: ``rollout.native.x`` → ``rollout.x``)."""


def tagged_union(key: str, default: str, *models: type[BaseModel]) -> Any:
    """A discriminated union on ``key`` where a mapping without ``key`` means ``default``.

    ``rollout: {max_tokens: 5}`` is then a native rollout, and errors still name the variant's
    fields (``rollout.max_tokns: unknown field``) instead of a missing discriminator. A value that
    is not a mapping (``rollout: 5``) fails with ``MAPPING_EXPECTED``: ``expected a mapping (e.g.
    {backend: native, ...}), got 5``.
    """
    tags = [model.model_fields[key].default for model in models]

    def pick(value: Any) -> str | None:
        if isinstance(value, dict):
            return value.get(key, default)
        if value is None:
            return default  # `rollout: null` / an empty section means the default kind
        return getattr(value, key, None)

    def need_mapping(value: Any) -> Any:
        if value is None or isinstance(value, dict | BaseModel):
            return value
        hint = f"; did you mean {{{key}: {value}}}?" if value in tags else ""
        got = repr(value) if len(repr(value)) <= 60 else f"a {type(value).__name__}"
        raise PydanticCustomError(
            MAPPING_EXPECTED,
            "expected a mapping (e.g. {example}), got {got}{hint}",
            {"example": f"{{{key}: {default}, ...}}", "got": got, "hint": hint},
        )

    UNION_TAGS.update(tags)
    variants = tuple(Annotated[model, Tag(tag)] for model, tag in zip(models, tags, strict=True))
    union = Union[variants]  # noqa: UP007 (a tuple of variants needs the subscript form)
    return Annotated[union, Discriminator(pick), BeforeValidator(need_mapping)]
