"""Fixtures of the API tests: an in-process app over a fake launcher, a real local Ray head
(one per test session: starting Ray costs ~10 s on 2 cores) and real ``fp8rl serve`` processes.

Processes are stopped by the ids these fixtures started (never by name): the service by its pid,
Ray through ``LocalRay.stop`` (SIGTERM to its ``ray start --block`` process, then its group).
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

sys.path.insert(0, str(Path(__file__).parent))

from api_fakes import FakeLauncher
from api_helpers import TOKEN, Server

from fp8rl.services.api import ApiSettings, create_app
from fp8rl.services.api.ray_launcher import LocalRay, start_local_ray


@pytest.fixture
def fake() -> FakeLauncher:
    """A fresh fake launcher."""
    return FakeLauncher()


@pytest.fixture
def settings(tmp_path: Path) -> ApiSettings:
    """Settings over a temporary data directory and SQLite store."""
    return ApiSettings(
        data_dir=tmp_path / "data",
        db_url=f"sqlite:///{tmp_path / 'data' / 'runs.db'}",
        token=TOKEN,
        monitor_interval_s=0.1,
        sse_poll_s=0.05,
        stop_timeout_s=5.0,
        lost_job_grace_s=0.0,
        max_body_bytes=64 * 1024,
    )


@pytest.fixture
def client(settings: ApiSettings, fake: FakeLauncher) -> Iterator[TestClient]:
    """The app in-process (lifespan run) over the fake launcher."""
    with TestClient(create_app(settings, launcher=fake)) as test_client:
        yield test_client


@pytest.fixture(scope="session")
def ray_head(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalRay]:
    """A real local Ray head with a dashboard (the Job Submission API), 2 CPUs."""
    head = start_local_ray(tmp_path_factory.mktemp("ray") / "ray.log", num_cpus=2)
    try:
        yield head
    finally:
        head.stop(remove_files=True)


@pytest.fixture(scope="module")
def server(ray_head: LocalRay, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """One real service per test module, on the session's Ray, running the stand-in driver."""
    srv = Server(tmp_path_factory.mktemp("serve"), ray_address=ray_head.dashboard_url).start()
    try:
        yield srv
    finally:
        srv.stop()
