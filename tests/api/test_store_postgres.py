"""The run store on PostgreSQL: migrations, state rules, JSON metrics and the API over it.

Starts a throwaway PostgreSQL server (initdb into a temp dir, unix socket only, no TCP) when the
binaries and psycopg are available, and stops it with ``pg_ctl stop`` (the server this module
started). Skipped otherwise, with the reason.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from api_fakes import FakeLauncher
from api_helpers import AUTH, QUICKSTART

from fp8rl.protocol import RunState
from fp8rl.services.store import RunReporter, RunStore
from fp8rl.services.store.schema import metadata

pytest.importorskip(
    "psycopg", reason="PostgreSQL tests need psycopg (pip install 'psycopg[binary]')"
)


def _pg_command(*args: str) -> list[str]:
    """Run as the ``postgres`` user when we are root (initdb refuses root)."""
    if os.geteuid() == 0:
        return ["runuser", "-u", "postgres", "--", *args]
    return list(args)


@pytest.fixture(scope="module")
def pg_url() -> Iterator[str]:
    """URL of a fresh PostgreSQL database on a unix socket in a temp dir."""
    initdb, pg_ctl = shutil.which("initdb"), shutil.which("pg_ctl")
    if not initdb or not pg_ctl:
        pytest.skip("PostgreSQL server binaries (initdb, pg_ctl) not installed")
    if os.geteuid() == 0 and shutil.which("runuser") is None:
        pytest.skip("running as root without runuser: initdb cannot run as root")
    root = Path(tempfile.mkdtemp(prefix="fp8rl-pg-"))
    data = root / "data"
    if os.geteuid() == 0:
        shutil.chown(root, "postgres", "postgres")
    try:
        subprocess.run(
            _pg_command(initdb, "-D", str(data), "-U", "fp8rl", "--auth=trust", "-E", "UTF8"),
            check=True,
            capture_output=True,
        )
        options = f"-k {root} -c listen_addresses='' -p 5432"
        subprocess.run(
            _pg_command(
                pg_ctl, "-D", str(data), "-o", options, "-l", str(root / "pg.log"), "-w", "start"
            ),
            check=True,
            capture_output=True,
        )
    except subprocess.CalledProcessError as exc:
        shutil.rmtree(root, ignore_errors=True)
        pytest.skip(f"could not start PostgreSQL: {exc.stderr.decode(errors='replace')[-300:]}")
    try:
        yield f"postgresql+psycopg://fp8rl@/postgres?host={root}&port=5432"
    finally:
        subprocess.run(
            _pg_command(pg_ctl, "-D", str(data), "-m", "fast", "-w", "stop"), capture_output=True
        )
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def pg_store(pg_url: str) -> Iterator[RunStore]:
    store = RunStore.open(pg_url, migrate=True)
    try:
        yield store
    finally:
        with store.engine.begin() as conn:
            for table in reversed(metadata.sorted_tables):
                conn.execute(table.delete())
        store.close()


def test_postgres_migrations_produce_exactly_the_declared_schema(pg_store):
    with pg_store.engine.connect() as conn:
        assert compare_metadata(MigrationContext.configure(conn), metadata) == []


def test_postgres_store_keeps_terminal_states_and_stores_nan_as_null(pg_store):
    pg_store.create_run(
        run_id="pg-1",
        name="pg",
        spec={"steps": 2},
        total_steps=2,
        quant_fingerprint=None,
        run_dir="/x",
        ray_job_id="fp8rl-pg-1",
    )
    reporter = RunReporter(pg_store, "pg-1")
    reporter.started(quant_fingerprint="fp", run_dir="/x/pg")
    reporter.step(1, {"loss": float("nan"), "reward/mean": 0.5})
    reporter.log("hello\nworld")
    reporter.finished(RunState.SUCCEEDED)
    assert not pg_store.finish("pg-1", RunState.FAILED)
    run = pg_store.get_run("pg-1")
    assert run.state is RunState.SUCCEEDED and run.created_at.tzinfo is not None
    assert pg_store.metrics("pg-1")[0].values == {"loss": None, "reward/mean": 0.5}
    assert pg_store.log_tail("pg-1", lines=5) == ["hello", "world"]


def test_api_runs_over_a_postgres_store(pg_url, pg_store, tmp_path):
    from fastapi.testclient import TestClient

    from fp8rl.services.api import ApiSettings, create_app

    settings = ApiSettings(data_dir=tmp_path, db_url=pg_url, token=AUTH["Authorization"].split()[1])
    fake = FakeLauncher()
    with TestClient(create_app(settings, launcher=fake)) as client:
        headers = {**AUTH, "Content-Type": "application/yaml", "Idempotency-Key": "pg-k"}
        first = client.post("/api/v1/runs", content=QUICKSTART.read_text(), headers=headers)
        again = client.post("/api/v1/runs", content=QUICKSTART.read_text(), headers=headers)
        listed = client.get("/api/v1/runs", headers=AUTH).json()
    assert first.status_code == 201 and again.json()["id"] == first.json()["id"]
    assert listed["total"] == 1
    assert fake.submitted[0]["env_vars"]["FP8RL_STORE_URL"].startswith("postgresql+psycopg://")
