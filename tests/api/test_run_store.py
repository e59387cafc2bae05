"""The run store, its migrations and the driver's reporter (SQLite files in tmp_path)."""

from __future__ import annotations

import subprocess
import sys
from datetime import timedelta

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext

from fp8rl.protocol import RunState
from fp8rl.services.store import RunReporter, RunStore, reporter_from_env
from fp8rl.services.store.engine import head_revision, normalize_url, open_engine, schema_revision
from fp8rl.services.store.schema import metadata


@pytest.fixture
def store(tmp_path) -> RunStore:
    opened = RunStore.open(f"sqlite:///{tmp_path / 'runs.db'}", migrate=True)
    yield opened
    opened.close()


def _run(store: RunStore, run_id: str = "r-1") -> str:
    store.create_run(
        run_id=run_id,
        name="r",
        spec={"steps": 3},
        total_steps=3,
        quant_fingerprint=None,
        run_dir="/tmp/r",
        ray_job_id=f"fp8rl-{run_id}",
    )
    return run_id


def test_migrations_produce_exactly_the_declared_schema(store):
    assert schema_revision(store.engine) == head_revision()
    with store.engine.connect() as conn:
        assert compare_metadata(MigrationContext.configure(conn), metadata) == []


def test_migrating_twice_is_a_no_op(tmp_path):
    url = f"sqlite:///{tmp_path / 'x.db'}"
    open_engine(url, migrate=True).dispose()
    engine = open_engine(url, migrate=True)
    assert schema_revision(engine) == head_revision()


def test_sqlite_store_runs_in_wal_mode(store):
    with store.engine.connect() as conn:
        assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"


def test_relative_sqlite_path_becomes_absolute_and_memory_is_refused():
    assert normalize_url("sqlite:///runs.db").database.startswith("/")
    with pytest.raises(ValueError, match="in-memory"):
        normalize_url("sqlite://")
    with pytest.raises(ValueError, match="not a SQLAlchemy URL") as info:
        normalize_url("postgres ql://user:hunter2@db")
    assert "hunter2" not in str(info.value)


def test_terminal_state_never_changes(store):
    run_id = _run(store)
    assert store.finish(run_id, RunState.SUCCEEDED)
    assert not store.finish(run_id, RunState.FAILED, error="late")
    assert not store.mark_running(run_id)
    assert not store.request_stop(run_id)
    run = store.get_run(run_id)
    assert run.state is RunState.SUCCEEDED and run.error is None


def test_finish_refuses_a_non_terminal_state(store):
    with pytest.raises(ValueError, match="must be STOPPED, SUCCEEDED or FAILED"):
        store.finish(_run(store), RunState.RUNNING)


def test_rereported_step_replaces_its_row_and_nonfinite_values_become_null(store):
    run_id = _run(store)
    store.add_metrics(run_id, 1, {"loss": 1.0})
    store.add_metrics(run_id, 1, {"loss": float("nan"), "kl": float("inf")})
    (row,) = store.metrics(run_id)
    assert row.values == {"loss": None, "kl": None}


@pytest.mark.parametrize(
    ("step", "values", "fragment"),
    [
        (-1, {"a": 1.0}, "non-negative"),
        (1, {"a": "high"}, "must be a number"),
        (1, {"": 1.0}, "names"),
    ],
)
def test_bad_metrics_are_refused_with_the_reason(store, step, values, fragment):
    with pytest.raises(ValueError, match=fragment):
        store.add_metrics(_run(store), step, values)


def test_stop_request_keeps_the_first_request_time(store):
    run_id = _run(store)
    store.request_stop(run_id)
    first = store.get_run(run_id).stop_requested_at
    store.request_stop(run_id)
    assert store.get_run(run_id).stop_requested_at == first and store.stop_requested(run_id)


def test_long_log_lines_are_cut(store):
    run_id = _run(store)
    store.add_log(run_id, "x" * 10_000)
    (line,) = store.log_tail(run_id, lines=5)
    assert len(line) < 4100 and line.endswith("[cut]")


def test_stale_unfinished_idempotency_claim_can_be_taken_over(store):
    keep = timedelta(hours=1)
    assert (
        store.claim_idempotency("k", "h", stale_after=timedelta(hours=1), keep_for=keep).outcome
        == "claimed"
    )
    assert (
        store.claim_idempotency("k", "h", stale_after=timedelta(hours=1), keep_for=keep).outcome
        == "in_progress"
    )
    assert (
        store.claim_idempotency("k", "h", stale_after=timedelta(0), keep_for=keep).outcome
        == "claimed"
    )


def test_reporter_from_env_is_none_without_the_variables():
    assert reporter_from_env({}) is None


def test_reporter_from_env_needs_both_variables(tmp_path):
    with pytest.raises(ValueError, match="FP8RL_RUN_ID is not set"):
        reporter_from_env({"FP8RL_STORE_URL": f"sqlite:///{tmp_path / 'x.db'}"})


def test_reporter_for_an_unknown_run_says_which(store):
    with pytest.raises(ValueError, match="'nope' is not a run"):
        RunReporter(store, "nope")


def test_reporter_writes_a_whole_run(store):
    run_id = _run(store)
    reporter = reporter_from_env({"FP8RL_STORE_URL": str(store.engine.url), "FP8RL_RUN_ID": run_id})
    reporter.started(quant_fingerprint="abc", run_dir="/runs/r")
    reporter.step(1, {"reward/mean": 0.25})
    reporter.log("hello")
    reporter.finished(RunState.SUCCEEDED)
    reporter.close()
    run = store.get_run(run_id)
    assert (run.state, run.quant_fingerprint, run.run_dir, run.current_step) == (
        RunState.SUCCEEDED,
        "abc",
        "/runs/r",
        1,
    )
    assert run.started_at is not None and run.finished_at >= run.started_at
    assert store.log_tail(run_id, lines=10) == ["hello"]


def test_reporter_log_handler_forwards_logging_records(store):
    import logging

    run_id = _run(store)
    logger = logging.getLogger("fp8rl.test.reporter")
    logger.addHandler(RunReporter(store, run_id).log_handler())
    logger.setLevel(logging.INFO)
    logger.info("step %d", 7)
    assert store.log_tail(run_id, lines=1)[0].endswith("fp8rl.test.reporter: step 7")


def test_store_package_imports_neither_torch_nor_ray():
    code = "import sys, fp8rl.services.store; print('torch' in sys.modules, 'ray' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]
