"""Prompt text -> token ids: the prompt template, then the tokenizer's chat template.

Token ids are produced once here and travel with the rollout; the trainer scores the same ids
(never re-tokenised). With ``chat_template=True`` and a tokenizer that has one, the prompt is
the user turn (after an optional system turn) with ``add_generation_prompt=True`` so the model
answers as the assistant; otherwise the plain text (system prompt, blank line, prompt) is
encoded with the tokenizer's special tokens (BOS where the tokenizer adds one).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fp8rl.services.data.records import PromptRecord


def format_prompt(record: PromptRecord, *, template: str) -> str:
    """``template.format(question=..., **row)``; raises ``ValueError`` naming an unknown placeholder."""
    fields = {**record.row, "question": record.question}
    try:
        return template.format(**fields)
    except KeyError as error:
        raise ValueError(
            f"prompt_template {template!r} uses {{{error.args[0]}}} but the row has only: {', '.join(fields)}"
        ) from error
    except (IndexError, AttributeError, TypeError) as error:  # {0}, {question.x}, {question[0][0]}
        raise ValueError(
            f"prompt_template {template!r} cannot be applied to a row: {error}"
        ) from error


def render_prompt(
    record: PromptRecord,
    *,
    tokenizer: Any,
    template: str,
    system_prompt: str | None,
    chat_template: bool,
) -> list[int]:
    """Token ids (list of int) of ``record`` rendered for generation.

    ``tokenizer``: a Hugging Face tokenizer. Uses ``apply_chat_template`` (with
    ``add_generation_prompt=True``) when ``chat_template`` is set and ``tokenizer.chat_template``
    exists; else encodes ``system_prompt + "\\n\\n" + text`` (or just the text).
    """
    text = format_prompt(record, template=template)
    if chat_template and getattr(tokenizer, "chat_template", None):
        messages = [{"role": "system", "content": system_prompt}] if system_prompt else []
        messages.append({"role": "user", "content": text})
        ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        if isinstance(ids, Mapping):  # transformers >= 5 returns a BatchEncoding
            ids = ids["input_ids"]
        return [int(i) for i in ids]
    if system_prompt:
        text = f"{system_prompt}\n\n{text}"
    return [int(i) for i in tokenizer(text)["input_ids"]]
