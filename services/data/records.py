"""The unit every prompt source produces: one problem with its reference answer."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class PromptRecord:
    """One prompt: stable ``prompt_id``, problem text, raw reference answer, and the source row.

    ``answer`` is kept raw (for GSM8K the whole solution ending in ``#### 18``): the reward
    function parses it, so the dataset never guesses the answer format. ``row`` holds every
    field of the source row (usable as ``{field}`` in the prompt template).
    """

    prompt_id: str
    question: str
    answer: str
    row: dict[str, Any] = field(default_factory=dict)
