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
        # psycopg calls these OperationalError; they are a statement's, not an outage
        with engine.connect() as holder:
            holder.execute(sa.text("CREATE TABLE locked (x int)"))
            holder.commit()
            holder.execute(sa.text("LOCK TABLE locked"))
            lock_timeout = _error_of(engine, "SET lock_timeout = '10ms'; LOCK TABLE locked")
            holder.rollback()
        assert getattr(getattr(lock_timeout, "orig", None), "sqlstate", None) == "55P03"
        assert not db.is_outage(lock_timeout)
        # a connection the server ends (pg_terminate_backend: 57P01) is one
        terminated = _error_of(engine, "SELECT pg_terminate_backend(pg_backend_pid())")
        assert db.is_outage(terminated)
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


# What PostgreSQL 15 says at connect, word for word; the first five pass with time (a
# restart or failover says several in turn), the rest never do.
_NOT_YET = (
    "FATAL:  the database system is starting up",
    "FATAL:  the database system is shutting down",
    "FATAL:  the database system is not yet accepting connections",
    "FATAL:  the database system is in recovery mode",
    "FATAL:  sorry, too many clients already",
)
_NEVER = (
    'FATAL:  database "x" does not exist',
    'FATAL:  role "x" does not exist',
    'FATAL:  password authentication failed for user "x"',
    'FATAL:  no pg_hba.conf entry for host "127.0.0.1", user "x", database "x", no encryption',
    'FATAL:  permission denied for database "x"',
    'FATAL:  role "x" is not permitted to log in',
)


@pytest.mark.parametrize("fatal", _NOT_YET + _NEVER)
def test_a_connect_fatal_is_permanent_only_when_waiting_cannot_help(fatal: str) -> None:
    import psycopg

    text = f'connection failed: connection to server at "127.0.0.1", port 5432 failed: {fatal}'
    permanent, reason = db.connect_failure(psycopg.OperationalError(text))
    assert permanent == (fatal in _NEVER)
    assert reason == text.removeprefix("connection failed: ")
