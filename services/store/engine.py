"""Database engines for the run store: SQLite (default, WAL) or PostgreSQL, and migrations.

SQLite is opened in WAL mode with a busy timeout because two processes write to the same file at
once: the API service (run states, stop requests) and the driver inside a Ray job (metrics, logs).
WAL lets readers (the SSE streams) run while a writer commits; ``busy_timeout`` makes a second
writer wait instead of failing with "database is locked". PostgreSQL needs no such settings; give
its URL (``postgresql+psycopg://user:pass@host/db``, needs the ``psycopg`` package).

The schema is versioned with Alembic (migrations in ``migrations/versions``). Only the service
migrates (``open_engine(url, migrate=True)``); the driver's reporter opens an existing store.
"""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import URL, make_url

MIGRATIONS_DIR = Path(__file__).with_name("migrations")
SQLITE_BUSY_TIMEOUT_MS = 10_000
"""How long a SQLite writer waits for another process's write lock before failing."""


def normalize_url(url: str | URL) -> URL:
    """Parse a SQLAlchemy URL; a relative SQLite file path becomes absolute.

    The driver runs in another working directory (a Ray job), so it must receive an absolute path.

    Raises:
        ValueError: the URL cannot be parsed, or it is an in-memory SQLite database (two processes
            cannot share one).
    """
    try:
        parsed = make_url(url)
    except Exception:  # sqlalchemy raises ArgumentError; the text may hold a password: not echoed
        raise ValueError(
            "the store URL is not a SQLAlchemy URL (e.g. sqlite:////var/lib/fp8rl/runs.db or "
            "postgresql+psycopg://user:pass@host/db)"
        ) from None
    if parsed.get_backend_name() == "sqlite":
        if parsed.database in (None, "", ":memory:"):
            raise ValueError(
                "store URL: an in-memory SQLite database cannot be shared with the driver; "
                "give a file, e.g. sqlite:////var/lib/fp8rl/runs.db"
            )
        parsed = parsed.set(database=str(Path(parsed.database).expanduser().resolve()))
    return parsed


def url_to_string(url: URL) -> str:
    """The URL with its password (for handing to the driver through the job's environment)."""
    return url.render_as_string(hide_password=False)


def open_engine(url: str | URL, *, migrate: bool = False) -> Engine:
    """Create an engine for the store at ``url``; with ``migrate`` upgrade its schema to head.

    Raises:
        ValueError: bad URL (see ``normalize_url``).
    """
    parsed = normalize_url(url)
    if parsed.get_backend_name() == "sqlite":
        Path(parsed.database).parent.mkdir(parents=True, exist_ok=True)
        engine = create_engine(
            parsed,
            connect_args={"timeout": SQLITE_BUSY_TIMEOUT_MS / 1000, "check_same_thread": False},
        )
        event.listen(engine, "connect", _sqlite_pragmas)
    else:
        engine = create_engine(parsed, pool_pre_ping=True)
    if migrate:
        upgrade(engine)
    return engine


def _sqlite_pragmas(dbapi_connection, _record) -> None:
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.close()


def _alembic_config() -> Config:
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    return config


def upgrade(engine: Engine) -> None:
    """Apply every pending migration (no-op when the schema is at head)."""
    config = _alembic_config()
    with engine.begin() as connection:
        config.attributes["connection"] = connection
        command.upgrade(config, "head")


def schema_revision(engine: Engine) -> str | None:
    """The Alembic revision the database is at (None: never migrated)."""
    with engine.connect() as connection:
        return MigrationContext.configure(connection).get_current_revision()


def head_revision() -> str:
    """The newest migration shipped with this package."""
    head = ScriptDirectory.from_config(_alembic_config()).get_current_head()
    assert head is not None, "no migrations found"
    return head
