"""A private local Ray is started lean: glibc malloc settings that return memory to the OS."""

from __future__ import annotations

import logging
import os

from fp8rl.services import runtime


def test_a_private_local_ray_inherits_malloc_settings_that_return_memory(monkeypatch):
    calls = []
    monkeypatch.setattr(runtime.ray, "is_initialized", lambda: False)
    monkeypatch.setattr(runtime.ray, "init", lambda **kw: calls.append(kw))
    monkeypatch.setattr(runtime, "_reachable_local_cluster", lambda: None)
    monkeypatch.setattr(runtime, "_private_head", lambda: "127.0.0.1:6390")
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    for key in [*runtime.LOCAL_MALLOC_ENV, "OMP_NUM_THREADS", runtime.RAY_PRESTART]:
        monkeypatch.delenv(key, raising=False)
    runtime.init_ray(None, cpu_threads=3)
    assert calls == [
        {"address": "127.0.0.1:6390", "log_to_driver": True, "logging_level": logging.WARNING}
    ]
    assert os.environ["MALLOC_ARENA_MAX"] == "2"  # the head's workers inherit it
    assert os.environ["OMP_NUM_THREADS"] == "3"  # not Ray's 1 thread for a core-less actor
    assert os.environ[runtime.RAY_PRESTART] == "0"  # no idle worker beside them


def test_local_workers_share_the_cores_by_the_largest_role(monkeypatch):
    from fp8rl.protocol import parse_job_spec

    monkeypatch.setattr(runtime.os, "sched_getaffinity", lambda pid: set(range(8)))
    assert runtime.local_cpu_threads(parse_job_spec("", [])) == 8
    two_ranks = parse_job_spec("", ["trainer.num_workers=2", "rollout.num_workers=4"])
    assert runtime.local_cpu_threads(two_ranks) == 2


def test_attaching_to_a_cluster_passes_no_local_options(monkeypatch):
    calls = []
    monkeypatch.setattr(runtime.ray, "is_initialized", lambda: False)
    monkeypatch.setattr(runtime.ray, "init", lambda **kw: calls.append(kw))
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.delenv(runtime.RAY_PRESTART, raising=False)
    runtime.init_ray("10.0.0.1:6379", cpu_threads=3)
    assert calls == [{"address": "10.0.0.1:6379", "log_to_driver": True}]
    assert "OMP_NUM_THREADS" not in os.environ  # a cluster's workers keep Ray's settings
    assert runtime.RAY_PRESTART not in os.environ
