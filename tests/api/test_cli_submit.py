"""``fp8rl runs submit SPEC [k=v …]``: POST the spec text with overrides, then follow the run."""

from __future__ import annotations

import threading

import pytest
from api_helpers import QUICKSTART, TOKEN, wait_for
from typer.testing import CliRunner

from fp8rl.protocol import RunState
from fp8rl.services.api.client import ApiClient
from fp8rl.services.cli import app
from fp8rl.services.commands import runs
from fp8rl.services.store.reporter import RunReporter


class InProcessClient(ApiClient):
    """An ApiClient over the app's TestClient (an httpx2 or httpx Client, as starlette picks), which
    the fixture closes."""

    def __init__(self, test_client, token: str) -> None:
        super().__init__("http://testserver", token)
        self._http.close()
        self._http = test_client
        test_client.headers["Authorization"] = f"Bearer {token}"

    def close(self) -> None:
        pass


@pytest.fixture
def cli_over_app(client, monkeypatch):
    """The CLI's API client talks to the in-process app."""

    def in_process(api, token, token_file):
        return InProcessClient(client, token)

    monkeypatch.setattr(runs, "_client", in_process)
    return client


def _submit(*args: str):
    common = ["--token", TOKEN]
    return CliRunner().invoke(app, ["runs", "submit", str(QUICKSTART), *args, *common])


def test_submit_detach_creates_the_run_with_the_overrides(cli_over_app):
    result = _submit("steps=3", "--detach")
    assert result.exit_code == 0, result.output
    run_id = result.output.split("submitted ")[1].split()[0]
    detail = cli_over_app.get(f"/api/v1/runs/{run_id}").json()
    assert detail["total_steps"] == 3
    assert f"fp8rl runs watch {run_id}" in result.output


def test_submit_follows_the_run_to_its_end(cli_over_app):
    service = cli_over_app.app.state.service

    def drive() -> None:
        listed = wait_for(lambda: service.store.list_runs(limit=1)[0], timeout_s=20, what="run")
        reporter = RunReporter(service.store, listed[0].id)
        reporter.started(quant_fingerprint="fp", run_dir="/x")
        reporter.step(1, {"reward/mean": 0.5})
        reporter.finished(RunState.SUCCEEDED)

    thread = threading.Thread(target=drive)
    thread.start()
    result = _submit("steps=1")
    thread.join()
    assert result.exit_code == 0, result.output
    assert "SUCCEEDED" in result.output


def test_submit_of_a_bad_override_prints_the_field_and_exits_1(cli_over_app):
    result = _submit("rollout.max_tokns=8", "--detach")
    assert result.exit_code == 1 and "max_tokns" in result.output


def test_a_refused_spec_prints_each_problem_once(cli_over_app):
    result = _submit("rollout.max_tokns=3", "steps=true", "--detach")
    assert result.exit_code == 1, result.output
    assert result.output.count("rollout.max_tokns: unknown field") == 1, result.output
    assert result.output.count("steps: expected an integer, got a boolean (true)") == 1
    assert result.output.startswith("422: Invalid job spec\n")
