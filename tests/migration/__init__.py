"""Migration tests. :func:`database_at` is the shared start of every upgrade test: a
database of either dialect migrated to an older revision and filled with rows there."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from sqlalchemy.engine import Engine

from outbox import db, migrate
from tests.conftest import drop_pg_database, new_pg_database


def database_at(request: pytest.FixtureRequest, tmp_path: Path, revision: str,
                fill: Callable[[Engine], None]) -> Iterator[str]:
    """Yield the URL of a database at ``revision`` holding the rows ``fill`` wrote
    (``request.param``: ``sqlite`` or ``postgres``); a PostgreSQL one is dropped after."""
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'old.db'}"
    else:
        admin = request.getfixturevalue("pg_admin_dsn")
        url = new_pg_database(admin, migrated=False)
    engine = db.create_engine(url)
    try:
        assert migrate.upgrade(engine, revision=revision) == revision
        fill(engine)
    finally:
        engine.dispose()
    yield url
    if request.param == "postgres":
        drop_pg_database(request.getfixturevalue("pg_admin_dsn"), url)
