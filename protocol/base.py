"""Base class of every fp8rl protocol model.

Every spec and message is a pydantic v2 model that refuses unknown keys (``extra="forbid"``: a
typo never silently becomes a default) and takes each field's description from the docstring
written under it (``use_attribute_docstrings``), so the docs, the JSON schema and the error
messages all come from one place.
"""

from __future__ import annotations

from typing import Annotated, Any, Union

from pydantic import BaseModel, ConfigDict, Discriminator, Tag


class StrictModel(BaseModel):
    """A pydantic model with unknown keys forbidden and field docstrings as descriptions."""

    model_config = ConfigDict(
        extra="forbid",
        use_attribute_docstrings=True,
        validate_assignment=True,
        protected_namespaces=(),
        coerce_numbers_to_str=True,  # name=123 from an override is the string "123"
    )


UNION_TAGS: set[str] = set()
"""Every tag value used by ``tagged_union`` (error paths drop them: ``rollout.native.x`` → ``rollout.x``)."""


def tagged_union(key: str, default: str, *models: type[BaseModel]) -> Any:
    """A discriminated union on ``key`` where a mapping without ``key`` means ``default``.

    ``rollout: {max_tokens: 5}`` is then a native rollout, and errors still name the variant's
    fields (``rollout.max_tokns: unknown field``) instead of a missing discriminator.
    """

    def pick(value: Any) -> str | None:
        if isinstance(value, dict):
            return value.get(key, default)
        if value is None:
            return default  # `rollout: null` / an empty section means the default kind
        return getattr(value, key, None)

    UNION_TAGS.update(model.model_fields[key].default for model in models)
    variants = tuple(Annotated[model, Tag(model.model_fields[key].default)] for model in models)
    return Annotated[Union[variants], Discriminator(pick)]  # noqa: UP007
