"""The dispatcher backs off for an outage and only for one (``outbox.db.is_outage``),
told apart on real errors from the real drivers."""

from __future__ import annotations

from pathlib import Path

import pytest
import sqlalchemy as sa

from outbox import db


def _error_of(engine: sa.Engine, sql: str) -> BaseException:
    with pytest.raises(Exception) as info, engine.connect() as conn:
        conn.execute(sa.text(sql))
    return info.value


def test_an_unreachable_postgresql_is_an_outage() -> None:
    engine = db.create_engine("postgresql://postgres@127.0.0.1:1/none", connect_timeout=1)
    assert db.is_outage(_error_of(engine, "SELECT 1"))


@pytest.mark.postgres
def test_a_statement_postgresql_refuses_is_not_an_outage(pg_url: str) -> None:
    engine = db.create_engine(pg_url)
    try:
        assert not db.is_outage(_error_of(engine, "SELECT 1 / 0"))  # DataError
        assert not db.is_outage(_error_of(engine, "SELECT * FROM no_such_table"))
        # a timestamp Python cannot hold is read (clamped), not an error
        with engine.connect() as conn:
            assert conn.execute(sa.text("SELECT CAST('infinity' AS timestamptz)")).scalar_one()
    finally:
        engine.dispose()


def test_a_busy_sqlite_is_an_outage_and_a_bad_statement_is_not(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'x.db'}"
    holder = db.create_engine(url)
    waiter = sa.create_engine(url, connect_args={"timeout": 0.05})
    with holder.begin() as conn:  # BEGIN IMMEDIATE: the write lock is held
        conn.execute(sa.text("CREATE TABLE t (x)"))
        busy = _error_of(waiter, "BEGIN IMMEDIATE")
    assert db.is_outage(busy)
    assert not db.is_outage(_error_of(waiter, "INSERT INTO t VALUES (1, 2)"))
    assert not db.is_outage(ValueError("a bug is not an outage"))
    holder.dispose()
    waiter.dispose()
