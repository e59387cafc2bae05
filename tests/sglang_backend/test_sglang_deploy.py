"""The SGLang image variant and job specs: parsed and validated (no Docker engine, no SGLang here)."""

from __future__ import annotations

import io
import re
import tomllib

import pytest
from sglang_api import VERSION

from fp8rl.protocol import load_job_spec
from fp8rl.services.preflight import preflight
from fp8rl.workers.model.build import layer_precision
from fp8rl.workers.model.loading import resolve_model
from fp8rl.workers.rollout.sglang_adapter import block_fp8_problems


def _dockerfile(repo, name: str):
    parse = pytest.importorskip("dockerfile_parse", reason="needs dockerfile-parse (the dev extra)")
    data = (repo / "deploy" / name).read_bytes()  # a path not named Dockerfile reads as a folder
    parser = parse.DockerfileParser(fileobj=io.BytesIO(data))
    assert parser.structure, f"deploy/{name} parsed to nothing"
    return parser


def _arg(parser, name: str) -> str:
    for i in parser.structure:
        if i["instruction"] == "ARG" and i["value"].startswith(f"{name}="):
            return i["value"].split("=", 1)[1]
    raise AssertionError(f"no ARG {name}")


def test_sglang_image_pins_the_checked_sglang_and_the_clusters_ray(repo):
    image, main = _dockerfile(repo, "Dockerfile.sglang"), _dockerfile(repo, "Dockerfile")
    assert _arg(image, "SGLANG_VERSION") == VERSION
    assert _arg(image, "RAY_VERSION") == _arg(main, "RAY_VERSION")
    runs = " ".join(i["value"] for i in image.structure if i["instruction"] == "RUN")
    assert '"sglang==${SGLANG_VERSION}"' in runs and "vllm" not in runs
    assert image.baseimage.startswith("nvidia/cuda:")
    users = [i["value"] for i in image.structure if i["instruction"] == "USER"]
    assert users and users[-1].split(":")[0] not in ("root", "0")


def test_sglang_image_copies_every_package_folder(repo):
    image = _dockerfile(repo, "Dockerfile.sglang")
    copied = {
        i["value"].split()[0].rstrip("/") for i in image.structure if i["instruction"] == "COPY"
    }
    folders = tomllib.loads((repo / "pyproject.toml").read_text())["tool"]["setuptools"][
        "package-dir"
    ].values()
    assert set(folders) <= copied
    assert (repo / "deploy" / "Dockerfile.sglang.dockerignore").exists()


def test_sglang_gpu_spec_passes_preflight_and_keeps_exact_off(repo):
    spec = load_job_spec(repo / "deploy" / "jobs" / "qwen2.5-7b-gsm8k-math-sglang-8gpu.yaml")
    preflight(spec, local=False)
    assert spec.rollout.backend == "sglang" and not spec.precision.exact
    assert spec.rollout.gpus_per_worker == spec.rollout.tensor_parallel_size
    assert spec.rollout.enable_memory_saver and spec.resources.placement == "colocated"


def test_sglang_quickstart_keeps_exactly_the_layers_sglang_cannot_fuse_in_bf16(repo, monkeypatch):
    monkeypatch.setenv("FP8RL_SGLANG_ENGINE", "fake")
    spec = load_job_spec(repo / "deploy" / "jobs" / "quickstart-sglang.yaml")
    preflight(spec, local=True)
    config = resolve_model(spec.model.path, load_weights=False).config
    lp = layer_precision(spec.model, spec.precision, role="rollout", trainable=False)
    assert block_fp8_problems(config, lp, tp=1) == []
    default = load_job_spec(
        repo / "deploy" / "jobs" / "quickstart-sglang.yaml",
        ["precision.quant.bf16_modules=[embed_tokens, lm_head]"],
    )
    lp = layer_precision(default.model, default.precision, role="rollout", trainable=False)
    problems = block_fp8_problems(config, lp, tp=1)
    assert problems and all(re.search(r"\.(q|k|v)_proj: \d+ output rows", p) for p in problems)
