"""Reconciliation rules of ``RunMonitor`` (store on SQLite, fake launcher, one pass at a time)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from api_fakes import FakeLauncher

from fp8rl.protocol import RunState
from fp8rl.services.api.monitor import RunMonitor
from fp8rl.services.store import RunStore


@pytest.fixture
def store(tmp_path) -> RunStore:
    opened = RunStore.open(f"sqlite:///{tmp_path / 'runs.db'}", migrate=True)
    yield opened
    opened.close()


def _setup(store, fake, *, stop_timeout_s=60.0, grace_s=0.0, run_id="r-1"):
    store.create_run(
        run_id=run_id,
        name="r",
        spec={},
        total_steps=3,
        quant_fingerprint=None,
        run_dir="/tmp/r",
        ray_job_id=f"fp8rl-{run_id}",
    )
    fake.submit(job_id=f"fp8rl-{run_id}", entrypoint="x", env_vars={})
    monitor = RunMonitor(
        store, fake, interval_s=1, stop_timeout_s=stop_timeout_s, lost_job_grace_s=grace_s
    )
    return run_id, monitor


def test_job_running_moves_a_pending_run_to_running(store):
    fake = FakeLauncher()
    run_id, monitor = _setup(store, fake)
    monitor.reconcile_once()
    assert store.get_run(run_id).state is RunState.RUNNING


def test_job_that_failed_without_reporting_fails_the_run_with_message_and_log_tail(store):
    fake = FakeLauncher()
    run_id, monitor = _setup(store, fake)
    fake.logs[f"fp8rl-{run_id}"] = ["Traceback", "RuntimeError: out of memory"]
    fake.set_state(
        f"fp8rl-{run_id}",
        RunState.FAILED,
        "Job entrypoint command failed with exit code 1, last available logs (truncated): …",
    )
    monitor.reconcile_once()
    run = store.get_run(run_id)
    assert run.state is RunState.FAILED
    assert run.error.startswith("Job entrypoint command failed with exit code 1\n")
    assert run.error.endswith("RuntimeError: out of memory")


def test_run_that_reported_success_keeps_it_when_the_job_then_fails(store):
    fake = FakeLauncher()
    run_id, monitor = _setup(store, fake)
    store.finish(run_id, RunState.SUCCEEDED)
    fake.set_state(f"fp8rl-{run_id}", RunState.FAILED, "exit 1 at shutdown")
    monitor.reconcile_once()
    assert store.get_run(run_id).state is RunState.SUCCEEDED


def test_job_that_exited_cleanly_after_a_stop_request_is_stopped(store):
    fake = FakeLauncher()
    run_id, monitor = _setup(store, fake)
    store.request_stop(run_id)
    fake.set_state(f"fp8rl-{run_id}", RunState.SUCCEEDED)
    monitor.reconcile_once()
    assert store.get_run(run_id).state is RunState.STOPPED


def test_job_stopped_outside_fp8rl_is_stopped_with_a_note(store):
    fake = FakeLauncher()
    run_id, monitor = _setup(store, fake)
    fake.set_state(f"fp8rl-{run_id}", RunState.STOPPED, "Job was intentionally stopped.")
    monitor.reconcile_once()
    run = store.get_run(run_id)
    assert run.state is RunState.STOPPED and "outside fp8rl" in run.error


def test_driver_that_ignores_the_stop_is_stopped_through_the_launcher_after_the_timeout(store):
    fake = FakeLauncher()
    run_id, monitor = _setup(store, fake, stop_timeout_s=30.0)
    store.request_stop(run_id)
    monitor.reconcile_once()
    assert fake.stopped == [] and store.get_run(run_id).state is not RunState.STOPPED
    with store.engine.begin() as conn:  # pretend the request is older than the timeout
        from sqlalchemy import update

        from fp8rl.services.store.schema import runs

        old = store.get_run(run_id).stop_requested_at - timedelta(seconds=31)
        conn.execute(update(runs).where(runs.c.id == run_id).values(stop_requested_at=old))
    monitor.reconcile_once()
    run = store.get_run(run_id)
    assert fake.stopped == [f"fp8rl-{run_id}"]
    assert run.state is RunState.STOPPED and "did not stop within 30 s" in run.error


def test_job_unknown_to_ray_fails_the_run_after_the_grace_period(store):
    fake = FakeLauncher()
    run_id, monitor = _setup(store, fake, grace_s=0.0)
    fake.jobs.clear()  # Ray was restarted: it lost every job
    monitor.reconcile_once()
    run = store.get_run(run_id)
    assert run.state is RunState.FAILED and "does not know job" in run.error


def test_young_run_whose_job_is_not_visible_yet_is_left_alone(store):
    fake = FakeLauncher()
    run_id, monitor = _setup(store, fake, grace_s=3600.0)
    fake.jobs.clear()
    monitor.reconcile_once()
    assert store.get_run(run_id).state is RunState.PENDING


def test_unreachable_ray_changes_nothing_and_is_reported(store):
    fake = FakeLauncher()
    run_id, monitor = _setup(store, fake)
    fake.unreachable = True
    monitor.reconcile_once()
    assert monitor.reachable is False and store.get_run(run_id).state is RunState.PENDING
    fake.unreachable = False
    monitor.reconcile_once()
    assert monitor.reachable is True and store.get_run(run_id).state is RunState.RUNNING


def test_service_start_reconciles_runs_that_ended_while_it_was_down(settings, fake):
    from fastapi.testclient import TestClient

    from fp8rl.services.api import create_app

    store = RunStore.open(settings.db_url, migrate=True)
    run_id, _ = _setup(store, fake)
    fake.set_state(f"fp8rl-{run_id}", RunState.FAILED, "killed by the OOM killer")
    settings.monitor_interval_s = 3600  # only the pass at start can have done it
    with TestClient(create_app(settings, launcher=fake)) as client:
        run = client.get(
            f"/api/v1/runs/{run_id}",
            headers={"Authorization": f"Bearer {settings.token.get_secret_value()}"},
        ).json()
    assert run["state"] == "FAILED" and "OOM" in run["error"]
