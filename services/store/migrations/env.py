"""Alembic environment: runs on the connection the store hands over (see ``engine.upgrade``).

``render_as_batch`` makes ALTER TABLE work on SQLite (copy-and-move), a no-op on PostgreSQL.
To write a new migration: ``alembic -x url=sqlite:////tmp/x.db revision --autogenerate`` with a
``script_location`` pointing here, then review the generated file.
"""

from __future__ import annotations

from alembic import context
from sqlalchemy import create_engine

from fp8rl.services.store.schema import metadata

connection = context.config.attributes.get("connection")


def _run(conn) -> None:
    context.configure(connection=conn, target_metadata=metadata, render_as_batch=True)
    with context.begin_transaction():
        context.run_migrations()


if connection is not None:
    _run(connection)
else:  # the alembic command line: alembic -x url=... upgrade head
    url = context.get_x_argument(as_dictionary=True).get("url")
    if not url:
        raise ValueError("give the store URL: alembic -x url=sqlite:////path/runs.db ...")
    with create_engine(url).begin() as conn:
        _run(conn)
