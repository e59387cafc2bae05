"""The megatron extra pins one megatron-core version that CI and the image both install."""

from __future__ import annotations

import tomllib


def test_megatron_extra_is_pinned_exactly_and_ci_installs_it(repo):
    project = tomllib.loads((repo / "pyproject.toml").read_text())["project"]
    assert project["optional-dependencies"]["megatron"] == ["megatron-core==0.16.1"]
    extras_line = next(
        line for line in (repo / ".ci" / "run").read_text().splitlines() if "FP8RL_EXTRAS=" in line
    )
    assert "megatron" in extras_line.split("FP8RL_EXTRAS=")[1].split()[0].split(",")


def test_installed_megatron_core_matches_the_pin():
    from importlib.metadata import version

    assert version("megatron-core") == "0.16.1"
