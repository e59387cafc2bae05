"""Answer extraction and the rule-based rewards (issue 6's answer-parsing table, GSM8K rules)."""

from __future__ import annotations

import pytest

from fp8rl.workers.reward.functions import (
    arithmetic_reward,
    format_reward,
    gsm8k_flexible_reward,
    gsm8k_strict_reward,
    resolve_reward_fn,
)
from fp8rl.workers.reward.parsing import extract_last_boxed, gsm8k_gold

EXTRA_TEXT = (
    "The reasoning above adds the two parts together, and nothing else changes afterwards. " * 5
)


def test_table_gsm8k_marker_followed_by_400_characters_scores_one():
    response = "2+40=42\n#### 42\n" + EXTRA_TEXT[:400]
    assert len(response) > 400
    assert gsm8k_strict_reward(response=response, answer="42") == 1.0


def test_table_gsm8k_marker_with_thousands_comma_scores_one():
    assert gsm8k_strict_reward(response="#### 1,234", answer="1234") == 1.0


def test_table_dollar_answer_without_marker_is_zero_strict_and_one_flexible():
    response = "The answer is $18."
    assert gsm8k_strict_reward(response=response, answer="18") == 0.0
    assert gsm8k_flexible_reward(response=response, answer="18") == 1.0


def test_gsm8k_last_marker_wins_and_full_solution_is_gold():
    gold = "Janet sells 16 - 3 - 4 = <<16-3-4=9>>9 duck eggs a day.\nShe makes 9 * 2 = $<<9*2=18>>18.\n#### 18"
    assert gsm8k_gold(gold) == "18"
    assert gsm8k_strict_reward(response="#### 17\nwait, recheck\n#### 18", answer=gold) == 1.0
    assert gsm8k_strict_reward(response="#### 18\nwait, recheck\n#### 17", answer=gold) == 0.0


@pytest.mark.parametrize(
    ("response", "gold", "expected"),
    [
        ("#### $1,234.", "1234", 1.0),
        ("#### 18.00", "18", 1.0),
        ("#### -7", "-7", 1.0),
        ("#### 7", "-7", 0.0),
        ("####", "0", 0.0),
        ("no marker 18", "18", 0.0),
    ],
)
def test_gsm8k_strict_number_normalisation(response, gold, expected):
    assert gsm8k_strict_reward(response=response, answer=gold) == expected


def test_arithmetic_reward_takes_final_integer_exactly():
    assert arithmetic_reward(response="3 + 5 = 8", answer="8") == 1.0
    assert arithmetic_reward(response="608 + 866 - 509 * 929 = -471387", answer="-471387") == 1.0
    assert arithmetic_reward(response="The answer is 8, not 9", answer="8") == 0.0
    assert arithmetic_reward(response="\\boxed{8} (checked with 9)", answer="8") == 1.0
    assert arithmetic_reward(response="8.5", answer="8") == 0.0
    assert arithmetic_reward(response="I don't know", answer="8") == 0.0


def test_last_boxed_balances_nested_braces_and_accepts_fbox():
    assert (
        extract_last_boxed("\\boxed{1} then \\boxed{\\frac{\\sqrt{3}}{2}}")
        == "\\frac{\\sqrt{3}}{2}"
    )
    assert extract_last_boxed("\\fbox{x^{2}}") == "x^{2}"
    assert extract_last_boxed("\\boxed{unclosed") is None
    assert extract_last_boxed("no box") is None


def test_format_reward_detects_final_answer_marker_or_custom_pattern():
    assert format_reward(response="so \\boxed{3}") == 1.0
    assert format_reward(response="#### 3") == 1.0
    assert format_reward(response="3") == 0.0
    assert format_reward(response="<think>a</think>3", pattern=r"<think>.*</think>") == 1.0


def test_resolve_reward_fn_by_dotted_path_and_refuses_unknown_names():
    assert resolve_reward_fn("gsm8k") is gsm8k_strict_reward
    assert resolve_reward_fn("fp8rl.workers.reward.functions.format_reward") is format_reward
    assert resolve_reward_fn("fp8rl.workers.reward.functions:format_reward") is format_reward
    with pytest.raises(ValueError, match="built-in"):
        resolve_reward_fn("nonsense")
    with pytest.raises(ValueError, match="cannot be loaded"):
        resolve_reward_fn("fp8rl.workers.reward.functions.missing_fn")
