"""A first run converts the built-in GGUF in a child process, so the driver does not keep the
conversion's memory for the whole run (issue 18, the quickstart's memory)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from fp8rl.services import model_cache
from fp8rl.workers.model import loading


@pytest.fixture
def children(monkeypatch):
    calls = []

    def run(args, check):
        calls.append(args)
        return subprocess.CompletedProcess(args, 0)

    monkeypatch.setattr(model_cache.subprocess, "run", run)
    monkeypatch.setattr(loading, "_convert_gguf", lambda *a: pytest.fail("converted in-process"))
    return calls


def _fake_gguf(tmp_path):
    gguf = tmp_path / "tiny.Q4_1.gguf"
    gguf.write_bytes(b"GGUF")
    return gguf


def test_an_uncached_gguf_is_converted_in_a_child_process(tmp_path, monkeypatch, children):
    monkeypatch.setenv("FP8RL_CACHE", str(tmp_path / "cache"))
    gguf = _fake_gguf(tmp_path)
    assert model_cache.convert_gguf_in_child(str(gguf))
    assert len(children) == 1
    assert children[0][0] == sys.executable and children[0][-1] == str(gguf)


def test_a_cached_gguf_starts_no_child(tmp_path, monkeypatch, children):
    monkeypatch.setenv("FP8RL_CACHE", str(tmp_path / "cache"))
    gguf = _fake_gguf(tmp_path)
    converted = loading.gguf_cache_target(gguf)
    converted.mkdir(parents=True)
    (converted / "config.json").write_text("{}")
    assert not model_cache.convert_gguf_in_child(str(gguf))
    assert children == []


def test_another_copys_conversion_does_not_count_as_cached(tmp_path, monkeypatch, children):
    """Another file's conversion (another key in the cache) must not keep this one's out of the
    child."""
    monkeypatch.setenv("FP8RL_CACHE", str(tmp_path / "cache"))
    gguf = _fake_gguf(tmp_path)
    other = tmp_path / "cache" / f"{gguf.stem}-0123456789ab"
    other.mkdir(parents=True)
    (other / "config.json").write_text("{}")
    assert model_cache.convert_gguf_in_child(str(gguf))
    assert len(children) == 1


def test_copies_of_one_gguf_share_a_cache_entry_and_a_changed_file_gets_its_own(
    tmp_path, monkeypatch
):
    """The cache key is the file's content: a second install of the same wheel (another path,
    another mtime) reuses the conversion instead of adding ~0.5 GB to the cache."""
    monkeypatch.setenv("FP8RL_CACHE", str(tmp_path / "cache"))
    first = _fake_gguf(tmp_path)
    (tmp_path / "venv2").mkdir()
    second = _fake_gguf(tmp_path / "venv2")
    assert loading.gguf_cache_target(first) == loading.gguf_cache_target(second)
    second.write_bytes(b"GGUF-changed")
    assert loading.gguf_cache_target(first) != loading.gguf_cache_target(second)


def test_models_that_need_no_conversion_start_no_child(tmp_path, children):
    for path in ("random:tiny", str(tmp_path), str(tmp_path / "missing.gguf")):
        assert not model_cache.convert_gguf_in_child(path)
    assert children == []


def test_the_child_resolves_the_model_and_reports_its_exit_code(tmp_path, monkeypatch):
    """The child's code really runs ``resolve_model``: a resolvable path succeeds, a broken one
    fails (the caller then converts, or reports the problem, itself)."""
    monkeypatch.setenv("FP8RL_CACHE", str(tmp_path / "cache"))
    (tmp_path / "x.gguf").write_bytes(b"GGUF")
    monkeypatch.setattr(model_cache, "_gguf_file", lambda path: tmp_path / "x.gguf")
    assert model_cache.convert_gguf_in_child("random:small-llama")  # needs no tokenizer
    assert not model_cache.convert_gguf_in_child("random:no-such-preset")


def test_the_child_does_not_import_from_the_working_directory(tmp_path, monkeypatch):
    """Run from a checkout's root, the child must not put the working directory first on
    sys.path: the top-level ``kernels/`` folder would hide the PyPI ``kernels`` package."""
    (tmp_path / "x.gguf").write_bytes(b"GGUF")
    monkeypatch.setenv("FP8RL_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(model_cache, "_gguf_file", lambda path: tmp_path / "x.gguf")
    monkeypatch.chdir(tmp_path)
    probe = "import os, sys; sys.exit(3 if '' in sys.path or os.getcwd() in sys.path else 0)"
    monkeypatch.setattr(model_cache, "_CONVERT", probe)
    assert model_cache.convert_gguf_in_child("anything")
