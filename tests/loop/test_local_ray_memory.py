"""A private local Ray is started lean: no dashboard, glibc malloc that returns memory."""

from __future__ import annotations

import os

from fp8rl.services import runtime


def test_local_ray_starts_without_dashboard_and_with_malloc_settings(monkeypatch):
    calls = []
    monkeypatch.setattr(runtime.ray, "is_initialized", lambda: False)
    monkeypatch.setattr(runtime.ray, "init", lambda **kw: calls.append(kw))
    for key in runtime.LOCAL_MALLOC_ENV:
        monkeypatch.delenv(key, raising=False)
    runtime.init_ray("local")
    assert calls == [{"address": "local", "log_to_driver": True, "include_dashboard": False}]
    assert os.environ["MALLOC_ARENA_MAX"] == "2"


def test_attaching_to_a_cluster_passes_no_local_options(monkeypatch):
    calls = []
    monkeypatch.setattr(runtime.ray, "is_initialized", lambda: False)
    monkeypatch.setattr(runtime.ray, "init", lambda **kw: calls.append(kw))
    runtime.init_ray("10.0.0.1:6379")
    assert calls == [{"address": "10.0.0.1:6379", "log_to_driver": True}]
