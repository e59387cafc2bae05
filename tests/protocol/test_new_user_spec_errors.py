"""What a new user's first mistakes print (issue 18's trial): an empty spec file, a misspelt
``checkpoint.resume`` keyword, and override errors that must name the override, not the file."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from fp8rl.protocol import SpecError, load_job_spec, parse_job_spec
from fp8rl.services.preflight import resume_problems


@pytest.mark.parametrize("text", ["", "\n", "# just a comment\n\n# another\n", "{}\n"])
def test_an_empty_or_comment_only_spec_file_is_refused_naming_the_file(tmp_path, text):
    path = tmp_path / "job.yaml"
    path.write_text(text)
    with pytest.raises(SpecError) as info:
        load_job_spec(path, ["steps=2"])
    assert str(path) in str(info.value)
    assert "empty or only comments" in str(info.value)


def test_spec_text_without_fields_stays_usable_with_overrides():
    assert parse_job_spec("", ["steps=3"]).steps == 3  # tests and the API build specs this way


def test_a_misspelt_resume_keyword_fails_validate_naming_the_field_and_the_keywords(repo):
    from fp8rl.services.cli import app

    spec = str(repo / "deploy" / "jobs" / "quickstart.yaml")
    result = CliRunner().invoke(app, ["validate", spec, "checkpoint.resume=atuo"])
    assert result.exit_code == 2, result.output
    assert "checkpoint.resume: 'atuo' is neither auto nor never" in result.output
    assert "did you mean auto?" in result.output
    assert "(set by override 'checkpoint.resume=atuo')" in result.output


def test_resume_accepts_its_keywords_and_existing_checkpoints_only(tmp_path):
    assert resume_problems("auto") == [] and resume_problems("never") == []
    (problem,) = resume_problems(str(tmp_path))  # exists, but holds no checkpoint
    assert "exists but is not a checkpoint" in problem
    (tmp_path / "step_2").mkdir()  # a checkpoint's shape, without its manifest
    (problem,) = resume_problems(str(tmp_path / "step_2"))
    assert "fails verification" in problem and "meta.json" in problem
    (problem,) = resume_problems(str(tmp_path))
    assert "holds no checkpoint that passes verification" in problem
    (problem,) = resume_problems(str(tmp_path / "nope"))
    assert problem.startswith("checkpoint.resume: ") and "existing checkpoint path" in problem
    aside = tmp_path / "step_1.unverified-20261205-101500"
    aside.mkdir()
    (aside / "meta.json").write_text("{}")
    (problem,) = resume_problems(str(aside))
    assert "moved aside for failing verification" in problem


def test_override_errors_name_the_override_not_the_spec_file(tmp_path):
    path = tmp_path / "job.yaml"
    path.write_text("steps: 2\n")
    with pytest.raises(SpecError) as info:
        load_job_spec(path, ["rollout.max_tokens=-1"])
    assert str(info.value).startswith(f"invalid override of {path}:")
    assert info.value.problems == [
        "rollout.max_tokens: Input should be greater than or equal to 1 (got -1) "
        "(set by override 'rollout.max_tokens=-1')"
    ]


def test_a_file_error_next_to_an_override_still_blames_the_file(tmp_path):
    path = tmp_path / "job.yaml"
    path.write_text("stpes: 2\n")
    with pytest.raises(SpecError) as info:
        load_job_spec(path, ["rollout.max_tokens=-1"])
    assert str(info.value).startswith(f"invalid {path}:")
    assert "stpes: unknown field — did you mean steps?" in info.value.problems
    assert any("(set by override 'rollout.max_tokens=-1')" in p for p in info.value.problems)


def test_a_malformed_override_is_named(tmp_path):
    path = tmp_path / "job.yaml"
    path.write_text("steps: 2\n")
    with pytest.raises(SpecError) as info:
        load_job_spec(path, ["steps.x=1"])
    assert info.value.problems == [
        "override 'steps.x=1': steps.x: steps is a value (2), not a section with fields"
    ]
    with pytest.raises(SpecError) as info:
        load_job_spec(path, ["rollout.n=4", "rollout.n.x.y=3"])
    assert info.value.problems == [
        "override 'rollout.n.x.y=3': rollout.n.x.y: rollout.n is a value (4), not a section with "
        "fields"
    ]


def test_a_spec_file_that_is_not_utf8_text_is_refused_naming_the_file(tmp_path):
    path = tmp_path / "job.yaml"
    path.write_bytes("steps: 2\n".encode("utf-16"))
    with pytest.raises(SpecError, match="is not UTF-8 text") as info:
        load_job_spec(path)
    assert str(path) in str(info.value)


@pytest.mark.parametrize(
    "override", ["trainer.lr=inf", "rollout.temperature=inf", "trainer.lr=nan"]
)
def test_an_infinite_or_nan_number_is_refused_naming_the_field(override):
    with pytest.raises(SpecError, match=override.split("=")[0].replace(".", r"\.")):
        parse_job_spec("", [override])


def test_a_spec_that_scores_nothing_is_refused_naming_reward():
    with pytest.raises(SpecError) as info:
        parse_job_spec("", ["reward.functions=[]"])
    assert "reward: " in str(info.value) and "functions is empty and remote is not set" in str(
        info.value
    )
    spec = parse_job_spec("", ["reward.functions=[]", "reward.remote={url: 'http://rm:8000'}"])
    assert spec.reward.remote is not None


@pytest.mark.parametrize("override", ["seed=99999999999999999999999", "seed=-1", "rollout.seed=-3"])
def test_a_seed_outside_what_the_samplers_take_is_refused_naming_it(override):
    with pytest.raises(SpecError) as info:
        parse_job_spec("", [override])
    assert override.split("=")[0] in str(info.value)
