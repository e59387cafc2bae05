"""A new user's YAML slips the lax pydantic defaults let through or worded for pydantic's authors:
``steps: true`` silently became ``steps=1`` (and ``rollout.n: true`` failed as ``got 1``), and
``rollout=5`` printed ``Unable to extract tag using discriminator pick()``."""

from __future__ import annotations

import pytest
from pydantic import ValidationError
from typer.testing import CliRunner

from fp8rl.protocol import JobSpec, SamplingParams, SpecError, parse_job_spec


def _problems(text: str = "", overrides: tuple[str, ...] = ()) -> list[str]:
    with pytest.raises(SpecError) as info:
        parse_job_spec(text, list(overrides))
    return info.value.problems


def test_a_yaml_boolean_for_an_integer_field_is_refused_not_read_as_1():
    assert _problems("steps: true\n") == ["steps: expected an integer, got a boolean (true)"]


def test_a_boolean_rollout_n_names_the_boolean_not_the_1_it_was_coerced_to():
    assert _problems(overrides=("rollout.n=true",)) == [
        "rollout.n: expected an integer, got a boolean (true) (set by override 'rollout.n=true')"
    ]


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("trainer: {lr: false}", "trainer.lr: expected a number, got a boolean (false)"),
        ("seed: false", "seed: expected an integer, got a boolean (false)"),
        ("data: {train: {difficulty: true}}", "data.train.difficulty: expected an integer"),
        ("rollout: {backend: vllm, top_k: true}", "rollout.top_k: expected an integer"),
        ("algorithm: {clip_ratio_low: true}", "algorithm.clip_ratio_low: expected a number"),
        ("eval: {limit: true}", "eval.limit: expected an integer"),  # int | None
        (
            "rollout: {stop_token_ids: [2, true]}",
            "rollout.stop_token_ids: expected an integer at index 1, got a boolean (true)",
        ),
        ("trainer: {betas: [0.9, false]}", "trainer.betas: expected a number at index 1"),
    ],
)
def test_a_boolean_is_refused_wherever_a_number_is_expected(text, problem):
    (line,) = _problems(text)
    assert line.startswith(problem), line


def test_booleans_ints_and_string_choices_still_validate_where_they_belong():
    job = parse_job_spec(
        "steps: 3\ndata: {shuffle: false}\ntrainer: {lr: 1}\nprecision: {mode: fp8_rollout}\n",
        ["rollout.temperature=1", "rollout.stop_token_ids=[2, 0, 1]", "precision.exact=true"],
    )
    assert job.steps == 3 and job.data.shuffle is False and job.precision.exact is True
    assert job.trainer.lr == 1.0 and job.rollout.temperature == 1.0
    assert job.rollout.stop_token_ids == [2, 0, 1] and job.precision.mode == "fp8_rollout"


def test_message_items_are_not_scanned_for_booleans_but_spec_items_are():
    """A rollout's token lists are built by code and run to thousands of items: only specs,
    which users type, pay for the per-item scan."""
    from fp8rl.protocol.base import MessageModel, StrictModel

    class Spec(StrictModel):
        ids: list[int]

    class Message(MessageModel):
        ids: list[int]

    with pytest.raises(ValidationError, match="expected an integer at index 1, got a boolean"):
        Spec(ids=[3, True])
    assert Message(ids=[3, True]).ids == [3, 1]  # pydantic's lax int, as before
    assert issubclass(SamplingParams, MessageModel)


def test_messages_refuse_a_boolean_number_too():
    with pytest.raises(ValidationError, match="expected an integer, got a boolean"):
        SamplingParams(max_tokens=True)
    job = JobSpec()
    with pytest.raises(ValidationError, match="expected an integer, got a boolean"):
        job.steps = True  # validate_assignment


@pytest.mark.parametrize(
    ("override", "problem"),
    [
        ("rollout=5", "rollout: expected a mapping (e.g. {backend: native, ...}), got 5"),
        ("trainer=x", "trainer: expected a mapping (e.g. {backend: native, ...}), got 'x'"),
        ("data.train=7", "data.train: expected a mapping (e.g. {type: arithmetic, ...}), got 7"),
        ("rollout=[1, 2]", "rollout: expected a mapping (e.g. {backend: native, ...}), got [1, 2]"),
        (
            "rollout=vllm",
            "rollout: expected a mapping (e.g. {backend: native, ...}), got 'vllm'; "
            "did you mean {backend: vllm}?",
        ),
    ],
)
def test_a_scalar_for_a_tagged_section_says_a_mapping_is_expected(override, problem):
    assert _problems(overrides=(override,)) == [f"{problem} (set by override {override!r})"]


@pytest.mark.parametrize(
    ("override", "problem"),
    [
        ("reward=5", "reward: expected a mapping, got 5"),
        ("precision=fp8", "precision: expected a mapping, got 'fp8'"),
        ("reward.functions=[5]", "reward.functions.0: expected a mapping, got 5"),
    ],
)
def test_a_scalar_for_a_plain_section_says_a_mapping_is_expected(override, problem):
    assert _problems(overrides=(override,)) == [f"{problem} (set by override {override!r})"]


def test_validate_of_rollout_5_prints_no_pydantic_internals(repo):
    from fp8rl.services.cli import app

    spec = str(repo / "deploy" / "jobs" / "quickstart.yaml")
    result = CliRunner().invoke(app, ["validate", spec, "rollout=5"])
    assert result.exit_code == 2, result.output
    assert "rollout: expected a mapping (e.g. {backend: native, ...}), got 5" in result.output
    assert "discriminator" not in result.output and "pick()" not in result.output
