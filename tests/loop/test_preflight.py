"""Specs that cannot run are refused before anything starts, one line per field."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

import pytest
import torch

from fp8rl.protocol import SpecError, parse_job_spec
from fp8rl.services.preflight import preflight


def _problems(*overrides: str, local: bool = True) -> list[str]:
    with pytest.raises(SpecError) as info:
        preflight(parse_job_spec("", list(overrides)), local=local)
    return info.value.problems


def test_megatron_fp8_kv_cache_is_refused_and_several_ranks_are_not():
    problems = _problems(
        "trainer.backend=megatron",
        "trainer.num_workers=2",
        "precision.quant.kv_cache_dtype=fp8_e4m3",
        local=False,
    )
    assert [p.split(":")[0] for p in problems] == ["precision.quant.kv_cache_dtype"]


def test_more_trainer_ranks_than_mini_batch_sequences_are_refused():
    problems = _problems(
        "trainer.num_workers=4",
        "trainer.micro_batch_size=1",
        "trainer.mini_batch_size=2",
        local=False,
    )
    assert problems[0].startswith("trainer.num_workers: 4 data-parallel trainer replicas")


@pytest.mark.parametrize(("tp", "refused"), [(1, True), (2, False)])
def test_megatron_counts_only_data_parallel_replicas_against_the_mini_batch(tp, refused):
    problems = _problems(
        "trainer.backend=megatron",
        "trainer.num_workers=4",
        f"trainer.tensor_parallel_size={tp}",
        "trainer.micro_batch_size=1",
        "trainer.mini_batch_size=2",
        "precision.quant.kv_cache_dtype=fp8_e4m3",  # always refused: the check raises
        local=False,
    )
    assert any(p.startswith("trainer.num_workers: 4 data-parallel") for p in problems) == refused


def test_sglang_backend_refuses_exact_mode_and_a_missing_sglang(monkeypatch):
    monkeypatch.delenv("FP8RL_SGLANG_ENGINE", raising=False)
    (problem,) = _problems("rollout.backend=sglang", "precision.exact=true", local=False)
    assert problem.startswith("precision.exact: true needs fp8rl's batch-invariant kernels")
    if importlib.util.find_spec("sglang") is None:
        problems = _problems("rollout.backend=sglang", "model.path=random:tiny-llama")
        assert problems == [
            "rollout.backend: sglang is not installed here; run the SGLang image "
            "(deploy/Dockerfile.sglang, docs/sglang.md)"
        ]


def test_a_placement_beyond_the_declared_gpus_is_refused_naming_the_count():
    (problem,) = _problems(
        "resources.device=cuda",
        "resources.gpus_per_node=1",
        "trainer.gpus_per_worker=1",
        "rollout.gpus_per_worker=1",
        "rollout.num_workers=2",
        local=False,
    )
    assert problem.startswith("resources: the plan needs 2 GPUs")
    assert "num_nodes × gpus_per_node = 1 × 1 = 1" in problem


def test_template_without_question_or_with_bad_braces_is_refused():
    assert _problems("data.prompt_template='What is {questoin}?'", local=False)[0].startswith(
        "data.prompt_template: has no {question}"
    )
    assert (
        "not a valid format string"
        in _problems("data.prompt_template='What is {question'", local=False)[0]
    )


def test_unknown_reward_name_is_refused_before_ray_starts():
    (problem,) = _problems("reward.functions=[{name: nope}]", local=False)
    assert problem.startswith("reward.functions.0.name: 'nope' is neither a built-in")
    (problem,) = _problems("reward.functions=[{name: no_such_pkg.mod.fn}]")
    assert "cannot be loaded" in problem


def test_missing_model_and_dataset_files_are_refused_only_locally(tmp_path):
    overrides = (
        f"model.path={tmp_path}/nope",
        "data.train.type=file",
        f"data.train.path={tmp_path}/x.jsonl",
    )
    problems = _problems(*overrides)
    assert problems[0].startswith("model.path: ") and problems[1].startswith("data.train.path: ")
    preflight(
        parse_job_spec("", list(overrides)), local=False
    )  # a cluster's paths: not checked here


def test_a_model_path_that_is_not_a_model_is_refused_and_only_relative_paths_name_the_cwd(
    tmp_path,
):
    (tmp_path / "empty").mkdir()
    (tmp_path / "data.jsonl").write_text("{}\n")
    (problem,) = _problems(f"model.path={tmp_path}/empty")
    assert (
        problem
        == f"model.path: {tmp_path}/empty has no config.json: not a Hugging Face model directory"
    )
    (problem,) = _problems(f"model.path={tmp_path}/data.jsonl")
    assert problem.startswith(f"model.path: {tmp_path}/data.jsonl is a file but not a .gguf")
    (problem,) = _problems(f"model.path={tmp_path}/nope")
    assert "relative paths" not in problem
    (problem,) = _problems("model.path=nope-model")
    assert f"(relative paths are from {os.getcwd()})" in problem


def test_run_with_a_missing_dataset_exits_2_with_one_line_before_ray(tmp_path):
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "fp8rl.services.driver",
            "deploy/jobs/gsm8k-smollm2.yaml",
            f"data.train.path={tmp_path}/missing.jsonl",
            f"output_dir={tmp_path}",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2
    assert "data.train.path: " in done.stderr and "Traceback" not in done.stderr
    assert "Started a local Ray" not in done.stdout + done.stderr


def test_an_unknown_reward_name_is_reported_once_when_checked_locally():
    (problem,) = _problems("reward.functions=[{name: nope}]")
    assert problem.startswith("reward.functions.0.name: 'nope' is neither a built-in")


def test_a_resume_directory_that_holds_no_checkpoint_is_refused_naming_the_field(tmp_path):
    (problem,) = _problems(f"checkpoint.resume={tmp_path}", f"output_dir={tmp_path}")
    assert problem.startswith(f"checkpoint.resume: '{tmp_path}' exists but is not a checkpoint")
    (tmp_path / "checkpoints" / "step_3").mkdir(parents=True)  # an incomplete save only
    (problem,) = _problems(f"checkpoint.resume={tmp_path}", f"output_dir={tmp_path}")
    assert problem.startswith(f"checkpoint.resume: '{tmp_path}' holds no checkpoint that passes")


def test_an_output_dir_that_cannot_be_written_is_refused_naming_the_field(tmp_path):
    a_file = tmp_path / "runs"
    a_file.write_text("")
    (problem,) = _problems(f"output_dir={a_file}/sub")
    assert problem.startswith(f"output_dir: {a_file}/sub") and "not a directory" in problem
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    try:
        if os.access(locked, os.W_OK) and os.geteuid() == 0:
            pytest.skip("root writes into a read-only directory")
        (problem,) = _problems(f"output_dir={locked}/runs")
        assert problem.startswith(f"output_dir: {locked}/runs is not writable")
    finally:
        locked.chmod(0o700)
    assert not list(tmp_path.glob("**/.fp8rl-validate-*"))  # the probe leaves nothing


def test_megatron_not_installed_is_a_problem_naming_the_field_not_a_traceback(monkeypatch):
    import fp8rl.services.preflight as pf

    real = importlib.util.find_spec

    def find_spec(name: str, *args):  # what importlib does for megatron.core without megatron
        if name.startswith("megatron"):
            raise ModuleNotFoundError(f"No module named {name.split('.')[0]!r}")
        return real(name, *args)

    monkeypatch.setattr(pf.importlib.util, "find_spec", find_spec)
    problems = _problems("trainer.backend=megatron")
    assert any(p.startswith("trainer.backend: megatron-core is not installed") for p in problems)


def test_a_misspelt_or_clashing_reward_keyword_is_refused_naming_it():
    (problem,) = _problems(
        "reward.functions=[{name: arithmetic}, {name: format, kwargs: {patern: x}}]", local=False
    )
    assert problem.startswith("reward.functions.1.kwargs.patern: format takes no such argument")
    assert "did you mean pattern?" in problem
    (problem,) = _problems("reward.functions=[{name: arithmetic, kwargs: {answer: '4'}}]")
    assert problem.startswith("reward.functions.0.kwargs.answer: is set by the reward worker")
    (problem,) = _problems("eval.rewards={gsm: [{name: gsm8k, kwargs: {strict: true}}]}")
    assert problem.startswith("eval.rewards.gsm.0.kwargs.strict: gsm8k takes no such argument")
    ok = "reward.functions=[{name: format, kwargs: {pattern: 'x'}}]"
    preflight(parse_job_spec("", [ok]), local=True)


def test_a_custom_reward_taking_any_keyword_is_not_second_guessed(tmp_path, monkeypatch):
    (tmp_path / "my_rewards.py").write_text(
        "def open_ended(*, response, answer, **kw):\n    return 1.0\n"
        "def closed(*, response, answer, bonus=0.0):\n    return bonus\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    preflight(
        parse_job_spec("", ["reward.functions=[{name: my_rewards.open_ended, kwargs: {x: 1}}]"]),
        local=True,
    )
    (problem,) = _problems("reward.functions=[{name: my_rewards.closed, kwargs: {bonsu: 1}}]")
    assert "takes no such argument (it takes: bonus); did you mean bonus?" in problem


def test_a_positional_template_placeholder_is_refused():
    (problem,) = _problems("data.prompt_template='What is {question} {0}?'", local=False)
    assert problem.startswith("data.prompt_template: positional placeholder {0}")
    (problem,) = _problems("data.prompt_template='{question} {}'", local=False)
    assert problem.startswith("data.prompt_template: positional placeholder {}")


def test_a_model_directory_without_weights_or_sizes_and_a_fake_gguf_are_refused(tmp_path):
    import json

    sizes = {"vocab_size": 64, "hidden_size": 32, "intermediate_size": 64}
    sizes |= {"num_hidden_layers": 1, "num_attention_heads": 2, "model_type": "llama"}
    (tmp_path / "noweights").mkdir()
    (tmp_path / "noweights" / "config.json").write_text(json.dumps(sizes))
    (problem,) = _problems(f"model.path={tmp_path}/noweights")
    assert (
        problem
        == f"model.path: {tmp_path}/noweights: no .safetensors weights in {tmp_path}/noweights"
    )
    (tmp_path / "nosizes").mkdir()
    (tmp_path / "nosizes" / "config.json").write_text('{"model_type": "llama"}')
    (tmp_path / "nosizes" / "model.safetensors").write_bytes(b"")
    (problem,) = _problems(f"model.path={tmp_path}/nosizes")
    assert "config.json lacks vocab_size, hidden_size" in problem
    (tmp_path / "gpt2").mkdir()
    (tmp_path / "gpt2" / "config.json").write_text('{"model_type": "gpt2"}')
    (problem,) = _problems(f"model.path={tmp_path}/gpt2")
    assert "model_type 'gpt2' is not supported" in problem
    (tmp_path / "bad.gguf").write_text("garbage")
    (problem,) = _problems(f"model.path={tmp_path}/bad.gguf")
    assert problem == f"model.path: {tmp_path}/bad.gguf is not a GGUF file"


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without a GPU")
def test_a_worker_refusing_its_spec_at_start_exits_2_with_its_message_not_a_traceback(tmp_path):
    """A user error raised in a worker's __init__ (here: resources.device=cuda on a machine
    without a GPU) reaches the driver as Ray's ActorDiedError, text only; the driver prints the
    worker's one line and exits 2."""
    done = subprocess.run(
        [
            sys.executable, "-m", "fp8rl.services.driver", "deploy/jobs/quickstart.yaml",
            "resources.device=cuda", "steps=1", f"output_dir={tmp_path}",
        ],
        capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr[-2000:]
    assert (
        "run failed: ValueError: resources.device=cuda but no CUDA device is visible to this "
        "worker (raised while a worker started)" in done.stderr
    )
    assert "Traceback" not in done.stderr
