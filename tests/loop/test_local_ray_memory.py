"""A private local Ray is started lean: glibc malloc settings that return memory to the OS."""

from __future__ import annotations

import os

from fp8rl.services import runtime


def test_a_private_local_ray_inherits_malloc_settings_that_return_memory(monkeypatch):
    calls = []
    monkeypatch.setattr(runtime.ray, "is_initialized", lambda: False)
    monkeypatch.setattr(runtime.ray, "init", lambda **kw: calls.append(kw))
    monkeypatch.setattr(runtime, "_reachable_local_cluster", lambda: None)
    monkeypatch.setattr(runtime, "_private_head", lambda: "127.0.0.1:6390")
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    for key in runtime.LOCAL_MALLOC_ENV:
        monkeypatch.delenv(key, raising=False)
    runtime.init_ray(None)
    assert calls == [{"address": "127.0.0.1:6390", "log_to_driver": True}]
    assert os.environ["MALLOC_ARENA_MAX"] == "2"  # the head's workers inherit it


def test_attaching_to_a_cluster_passes_no_local_options(monkeypatch):
    calls = []
    monkeypatch.setattr(runtime.ray, "is_initialized", lambda: False)
    monkeypatch.setattr(runtime.ray, "init", lambda **kw: calls.append(kw))
    runtime.init_ray("10.0.0.1:6379")
    assert calls == [{"address": "10.0.0.1:6379", "log_to_driver": True}]
