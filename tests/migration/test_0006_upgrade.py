"""0006: the payload digest's fill-once rule as a trigger condition on PostgreSQL. A live
database at 0005 holding rows in every operation state upgrades to head with no row
changed; the rules refuse and allow what they did (a stored digest changed is refused, a
digest filled from none is allowed, every other protected column still refused); a real
``outboxd run --once`` then dispatches the rows. On both dialects (SQLite: no change)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Engine

from outbox import db, errors, migrate
from outbox.db import mapped_errors
from tests.migration import database_at
from tests.migration.test_0002_upgrade import (
    ROWS,
    _insert_every_state,
    dispatch_every_state,
    operations,
)
from tests.migration.test_migrations import assert_rules_work, triggers

DIGEST = "outbox_operations_digest_once"


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def at_0005(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    yield from database_at(request, tmp_path, "0005", _insert_every_state)


def _watched(engine: Engine) -> str:
    """The definition of the immutability trigger (PostgreSQL), upper case."""
    with engine.connect() as conn:
        return str(conn.execute(sa.text(
            "SELECT pg_get_triggerdef(oid) FROM pg_trigger "
            "WHERE tgname = 'outbox_operations_immutable'")).scalar_one()).upper()


def _digest_rule_holds(engine: Engine) -> None:
    with engine.begin() as conn:
        conn.exec_driver_sql(
            "INSERT INTO outbox_operations (tenant_id, task_id, operation_id, provider, payload) "
            "VALUES ('d', 'k', 'digest-check', 'p', '{\"a\": 1}')")
        conn.exec_driver_sql("UPDATE outbox_operations SET payload_digest = 'sha256:aa' "
                             "WHERE operation_id = 'digest-check'")  # filled once: allowed
        conn.exec_driver_sql("UPDATE outbox_operations SET payload_digest = 'sha256:aa' "
                             "WHERE operation_id = 'digest-check'")  # the same value: allowed
    for change in ("payload_digest = 'sha256:bb'", "payload_digest = NULL",
                   "payload_digest = 'sha256:bb', status_reason = 'x'",
                   "payload = '{\"a\": 2}'", "operation_id = 'renamed'"):
        with pytest.raises(errors.ImmutableField), mapped_errors(), engine.begin() as conn:
            conn.exec_driver_sql(f"UPDATE outbox_operations SET {change} "
                                 "WHERE operation_id = 'digest-check'")


@pytest.mark.slow
def test_rows_in_every_state_survive_0006_and_dispatch(at_0005: str, tmp_path: Path) -> None:
    engine = db.create_engine(at_0005)
    postgres = engine.dialect.name == "postgresql"
    try:
        before = operations(engine)
        if postgres:
            assert DIGEST not in triggers(engine)
            assert "PAYLOAD_DIGEST" in _watched(engine)
        assert migrate.upgrade(engine) == migrate.head()
        migrate.check_current(engine)
        assert operations(engine) == before  # the upgrade itself changed no row
        if postgres:
            assert DIGEST in triggers(engine)
            assert "PAYLOAD_DIGEST" not in _watched(engine)  # the condition guards it
        _digest_rule_holds(engine)
        assert_rules_work(engine)
        after = dispatch_every_state(engine, at_0005, tmp_path, before)
        assert set(ROWS) <= set(after)
    finally:
        engine.dispose()


def test_0006_downgrade_watches_the_digest_as_before(at_0005: str) -> None:
    engine = db.create_engine(at_0005)
    try:
        migrate.upgrade(engine)
        migrate.downgrade(engine, "0005")
        assert migrate.current(engine) == "0005"
        if engine.dialect.name == "postgresql":
            assert DIGEST not in triggers(engine)
            assert "PAYLOAD_DIGEST" in _watched(engine)
        _digest_rule_holds(engine)
    finally:
        engine.dispose()
