"""Job specs: YAML + overrides, errors that name the field, did-you-mean."""

from __future__ import annotations

import subprocess
import sys

import pytest

from fp8rl.protocol import JobSpec, SpecError, load_job_spec, parse_job_spec


def _problems(text: str = "", overrides: tuple[str, ...] = ()) -> list[str]:
    with pytest.raises(SpecError) as info:
        parse_job_spec(text, overrides)
    return info.value.problems


def test_shipped_job_specs_validate(repo):
    for path in sorted((repo / "deploy" / "jobs").glob("*.yaml")):
        job = load_job_spec(path)
        assert isinstance(job, JobSpec), path


def test_typo_in_override_suggests_the_field():
    assert _problems(overrides=("rollout.max_tokns=5",)) == [
        "rollout.max_tokns: unknown field — did you mean max_tokens? "
        "(set by override 'rollout.max_tokns=5')"
    ]


def test_typo_inside_list_item_names_the_index():
    problems = _problems(overrides=("eval.datasets=[{type: file, path: x, promt_key: q}]",))
    assert problems == [
        "eval.datasets.0.promt_key: unknown field — did you mean prompt_key? "
        "(set by override 'eval.datasets=[{type: file, path: x, promt_key: q}]')"
    ]


def test_negative_learning_rate_names_the_field():
    (problem,) = _problems(overrides=("trainer.lr=-1",))
    assert problem.startswith("trainer.lr: ") and "greater than 0" in problem


def test_unknown_backend_lists_the_choices():
    (problem,) = _problems(overrides=("rollout.backend=trt",))
    assert problem.startswith("rollout.backend: unknown kind 'trt'")
    assert "'vllm'" in problem


def test_override_switches_union_variant_and_parses_yaml_values():
    job = parse_job_spec("", ["rollout.backend=vllm", "rollout.gpu_memory_utilization=0.25"])
    assert job.rollout.backend == "vllm" and job.rollout.gpu_memory_utilization == 0.25
    job = parse_job_spec("", ["rollout.stop_token_ids=[1, 2]", "precision.exact=true"])
    assert job.rollout.stop_token_ids == [1, 2] and job.precision.exact is True


def test_malformed_override_is_refused():
    assert "must look like key=value" in _problems(overrides=("rollout.max_tokens",))[0]


def test_all_problems_are_reported_at_once():
    problems = _problems(overrides=("steps=0", "name=has space"))
    assert [p.split(":")[0] for p in problems] == ["name", "steps"]


def test_cross_field_rule_group_size_for_grpo():
    (problem,) = _problems(overrides=("rollout.n=1",))
    assert "rollout.n must be >= 2" in problem


def test_micro_batch_must_divide_mini_batch():
    (problem,) = _problems(overrides=("trainer.mini_batch_size=6", "trainer.micro_batch_size=4"))
    assert problem.startswith("trainer: ") and "multiple of micro_batch_size" in problem


def test_non_mapping_yaml_is_refused():
    assert "top level must be a mapping" in _problems("- a\n- b\n")[0]


def test_every_field_has_a_description():
    import fp8rl.protocol as proto

    stack = [getattr(proto, n) for n in proto.__all__ if isinstance(getattr(proto, n), type)]
    seen, missing = set(), []
    while stack:
        cls = stack.pop()
        if cls in seen or not hasattr(cls, "model_fields"):
            continue
        seen.add(cls)
        missing += [f"{cls.__name__}.{n}" for n, f in cls.model_fields.items() if not f.description]
        stack.extend(cls.__subclasses__())
    assert len(seen) > 20 and not missing, missing


def test_protocol_import_is_light():
    code = (
        "import sys, fp8rl.protocol; "
        "bad = [m for m in ('torch', 'ray') if m in sys.modules]; "
        "assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
