"""Packaging: one import package ``fp8rl``; every code folder is listed and installed under it."""

from __future__ import annotations

import tomllib
import zipfile
from pathlib import Path

import pytest

CODE_FOLDERS = ("services", "workers", "protocol", "kernels")


def test_every_code_package_is_listed_in_pyproject(repo: Path):
    listed = set(
        tomllib.loads((repo / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]
    )
    on_disk = {
        "fp8rl." + str(init.parent.relative_to(repo)).replace("/", ".")
        for folder in CODE_FOLDERS
        for init in (repo / folder).rglob("__init__.py")
    }
    assert on_disk == listed, (
        f"missing from pyproject: {on_disk - listed}; stale: {listed - on_disk}"
    )


def test_installed_package_is_the_only_top_level_name():
    import importlib.metadata as md

    import fp8rl.protocol

    installed = Path(fp8rl.protocol.__file__).resolve()
    if "site-packages" not in installed.parts:
        pytest.skip("editable install (a development checkout): CI checks the regular install")
    site = installed.parents[2]  # .../site-packages/fp8rl/protocol/__init__.py
    (dist,) = [d for d in md.distributions(path=[str(site)]) if d.metadata["Name"] == "fp8rl"]
    tops = {Path(f).parts[0] for f in dist.files or [] if f.suffix == ".py"}
    assert tops == {"fp8rl"}, tops


@pytest.mark.slow
def test_wheel_holds_only_fp8rl(repo: Path, tmp_path: Path):
    import subprocess
    import sys

    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", str(repo), "--no-deps", "-q", "-w", str(tmp_path)],
        check=True,
    )
    (wheel,) = tmp_path.glob("fp8rl-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}
    assert tops == {"fp8rl"}, tops
    assert (
        "fp8rl/kernels/__init__.py" in names
        and "fp8rl/services/store/migrations/script.py.mako" in names
    )
