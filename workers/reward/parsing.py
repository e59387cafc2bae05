"""Answer extraction from model responses: GSM8K markers, last number, last ``\\boxed{}``.

Pure string functions (no I/O). The GSM8K strict rule follows the dataset's own format and
lm-eval's "strict-match": the answer is the number after the LAST ``####`` anywhere in the
response (some public trainers only search the last 300 characters, which drops a correct
answer followed by chatter). Numbers are compared exactly as decimals after removing ``,`` and
``$`` (``1,234`` == ``1234``, ``18.00`` == ``18``).
"""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation

_NUMBER = r"-?(?:\$\s?)?\d[\d,]*(?:\.\d+)?"
_GSM8K_MARKER = re.compile(r"####\s*(" + _NUMBER + ")")
_ANY_NUMBER = re.compile(_NUMBER)
_BOX_OPEN = re.compile(r"\\(?:boxed|fbox)\s*\{")


def to_decimal(text: str | None) -> Decimal | None:
    """``"$1,234."`` -> ``Decimal("1234")``; None when ``text`` is not a plain number."""
    if text is None:
        return None
    cleaned = text.replace(",", "").replace("$", "").replace(" ", "").rstrip(".")
    try:
        value = Decimal(cleaned)
    except InvalidOperation:
        return None
    return value if value.is_finite() else None


def extract_gsm8k_strict(text: str) -> str | None:
    """The number after the last ``####`` in ``text`` (commas and ``$`` kept), or None."""
    matches = _GSM8K_MARKER.findall(text)
    return matches[-1] if matches else None


def extract_last_number(text: str) -> str | None:
    """The last number in ``text`` (``$``/commas allowed inside it), or None (lm-eval flexible-extract)."""
    matches = _ANY_NUMBER.findall(text)
    return matches[-1] if matches else None


def extract_last_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` or ``\\fbox{...}`` (nested braces balanced), or None."""
    starts = [m.end() for m in _BOX_OPEN.finditer(text)]
    for start in reversed(starts):
        depth = 1
        for index in range(start, len(text)):
            depth += {"{": 1, "}": -1}.get(text[index], 0)
            if depth == 0:
                return text[start:index]
    return None


def gsm8k_gold(answer: str) -> str:
    """The gold answer of a GSM8K row: the text after the last ``####`` (the raw answer if none)."""
    return answer.rsplit("####", 1)[-1].strip()


def numbers_equal(predicted: str | None, gold: str) -> bool:
    """Exact decimal equality after removing ``,`` and ``$``; False when either is not a number."""
    left, right = to_decimal(predicted), to_decimal(gold)
    return left is not None and right is not None and left == right
