"""Messages to and from the reward worker (import-light: no torch, no ray).

The driver builds one ``RewardInput`` per rollout sample (the decoded response text and the
dataset's raw answer) and gets one ``RewardOutput`` back, in the same order.
"""

from __future__ import annotations

from pydantic import Field

from fp8rl.protocol.base import MessageModel
from fp8rl.protocol.messages import FinishReason


class RewardInput(MessageModel):
    """One response to score."""

    prompt_id: str
    """The prompt it answers (dataset row id)."""

    prompt: str
    """The problem text as shown to the model (before the chat template)."""

    response: str
    """The decoded response text."""

    answer: str
    """The dataset's raw reference answer (for GSM8K the whole solution; the reward parses it)."""

    finish_reason: FinishReason
    """``stop`` or ``length`` (cut at max_tokens: handled per ``RewardSpec.truncated``)."""

    num_tokens: int = Field(ge=0)
    """Response length in tokens."""

    max_tokens: int = Field(ge=1)
    """The sampling limit the response was generated under."""


class RewardOutput(MessageModel):
    """The score of one response."""

    reward: float
    """Total reward: the weighted sum of the terms, or the truncation rule's value."""

    terms: dict[str, float] = Field(default_factory=dict)
    """Unweighted value of each reward term, by function name (``remote`` for the reward model)."""

    truncated: bool = False
    """The response was cut at max_tokens (``finish_reason == "length"``)."""

    timed_out: bool = False
    """A verifier or the remote reward model timed out (that term scored 0)."""
