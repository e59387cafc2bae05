"""Helpers of the API tests: constants, polling, and a real ``fp8rl serve`` process.

The service is stopped by the pid this module started (never by name).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from fp8rl.services.api.client import ApiClient
from fp8rl.workers.ports import free_port

TOKEN = "test-token-0123456789abcdef"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
STAND_IN = Path(__file__).with_name("stand_in_driver.py")
REPO = Path(__file__).resolve().parents[2]
QUICKSTART = REPO / "deploy" / "jobs" / "quickstart.yaml"


def wait_for(predicate, *, timeout_s: float, what: str, interval_s: float = 0.2):
    """Poll ``predicate`` until it returns a truthy value; fail naming ``what`` on timeout."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout_s:g} s waiting for {what}")
        time.sleep(interval_s)


class Server:
    """A real ``fp8rl serve`` process on a free loopback port (stand-in driver by default)."""

    def __init__(self, data_dir: Path, *, ray_address: str | None, entrypoint: str | None = None):
        self.data_dir = data_dir
        self.ray_address = ray_address
        self.entrypoint = entrypoint or f"{sys.executable} {STAND_IN}"
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen | None = None

    def start(self, *, timeout_s: float = 120.0) -> Server:
        """Start and wait until /healthz answers."""
        command = [
            sys.executable, "-m", "fp8rl.services.cli", "serve",
            "--port", str(self.port),
            "--data-dir", str(self.data_dir),
            "--stop-timeout", "3",
            "--driver-entrypoint", self.entrypoint,
            "--log-level", "warning",
        ]  # fmt: skip
        if self.ray_address:
            command += ["--ray-address", self.ray_address]
        env = {**os.environ, "FP8RL_API_TOKEN": TOKEN}
        env.pop("RAY_ADDRESS", None)
        env.pop("FP8RL_STORE_URL", None)
        self.data_dir.mkdir(parents=True, exist_ok=True)
        with open(self.data_dir / "serve.log", "ab") as log:
            self.proc = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT)

        def healthy() -> bool:
            if self.proc.poll() is not None:
                pytest.fail(f"fp8rl serve exited:\n{self.log_tail()}")
            try:
                return httpx.get(self.url + "/healthz", timeout=2).status_code == 200
            except httpx.HTTPError:
                return False

        wait_for(healthy, timeout_s=timeout_s, what=f"fp8rl serve on {self.url}")
        return self

    def log_tail(self, lines: int = 40) -> str:
        """The end of the service's log."""
        path = self.data_dir / "serve.log"
        return (
            "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
            if path.exists()
            else ""
        )

    def stop(self, *, kill: bool = False) -> None:
        """SIGTERM (graceful) or SIGKILL (a crash) the service process we started."""
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGKILL if kill else signal.SIGTERM)
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)

    def client(self) -> ApiClient:
        """An API client with the test token."""
        return ApiClient(self.url, TOKEN)
