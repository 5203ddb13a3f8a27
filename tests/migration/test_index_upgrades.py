"""Migrations that change no row: 0004 (the status index holds only rows at rest), 0005
(BRIN for the append-only tables' ``created_at`` on PostgreSQL) and 0006 (PostgreSQL's
immutability trigger asks its function only when an immutable column changed).
Each upgrades a live database at the revision before it, holding rows in every operation
state, to head: no row changes, the index is what the revision says, the gauges count every
state as a plain count does, and a real ``outboxd run --once`` dispatches the rows —
pending ones applied, expired leases recovered by the rules, rows at rest untouched. On
both dialects."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Engine

from dispatcher.maintenance import gauges
from outbox import db, migrate
from tests.migration import database_at
from tests.migration.test_0002_upgrade import (
    ROWS,
    _insert_every_state,
    dispatch_every_state,
    operations,
)

STATUS_INDEX = "ix_outbox_operations_status_updated"
BRIN_INDEXES = ("ix_outbox_events_created", "ix_outbox_attempts_created")


def _index_definition(engine: Engine, name: str) -> str:
    with engine.connect() as conn:
        if engine.dialect.name == "sqlite":
            sql = "SELECT sql FROM sqlite_master WHERE type = 'index' AND name = :n"
        else:
            sql = "SELECT indexdef FROM pg_indexes WHERE indexname = :n"
        return str(conn.execute(sa.text(sql), {"n": name}).scalar_one()).upper()


def _status_index_at_rest(engine: Engine, upgraded: bool) -> None:
    definition = _index_definition(engine, STATUS_INDEX)
    assert ("WHERE" in definition and "DISPATCHING" in definition) == upgraded, definition


def _brin_on_postgresql(engine: Engine, upgraded: bool) -> None:
    for name in BRIN_INDEXES:
        brin = "USING BRIN" in _index_definition(engine, name)
        assert brin == (upgraded and engine.dialect.name == "postgresql"), name


def _immutable_trigger_with_when(engine: Engine, upgraded: bool) -> None:
    """SQLite's trigger always had its ``WHEN``; PostgreSQL's has one from 0006."""
    with engine.connect() as conn:
        if engine.dialect.name == "sqlite":
            definition = conn.execute(sa.text(
                "SELECT sql FROM sqlite_master WHERE type = 'trigger'"
                " AND name = 'outbox_operations_immutable'")).scalar_one()
        else:
            definition = conn.execute(sa.text(
                "SELECT pg_get_triggerdef(oid) FROM pg_trigger"
                " WHERE tgname = 'outbox_operations_immutable'")).scalar_one()
    has_when = " WHEN " in " ".join(str(definition).upper().split())
    assert has_when == (upgraded or engine.dialect.name == "sqlite"), definition


CASES: dict[str, tuple[str, Callable[[Engine, bool], None]]] = {
    "0004": ("0003", _status_index_at_rest),
    "0005": ("0004", _brin_on_postgresql),
    "0006": ("0005", _immutable_trigger_with_when),
}


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def before_revision(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A database at the revision before the test's ``revision``, rows in every state."""
    previous = CASES[request.getfixturevalue("revision")][0]
    yield from database_at(request, tmp_path, previous, _insert_every_state)


@pytest.mark.slow
@pytest.mark.parametrize("revision", sorted(CASES))
def test_rows_in_every_state_survive_the_index_rebuild_and_dispatch(
    before_revision: str, tmp_path: Path, revision: str
) -> None:
    url = before_revision
    index_is_rebuilt = CASES[revision][1]
    engine = db.create_engine(url)
    try:
        before = operations(engine)
        index_is_rebuilt(engine, False)
        assert migrate.upgrade(engine) == migrate.head()
        migrate.check_current(engine)
        assert operations(engine) == before  # the upgrade itself changed no row
        index_is_rebuilt(engine, True)
        counted = gauges.refresh(engine)  # each part from its own index
        plain = Counter(str(r["status"]) for r in before.values())
        assert {s: n for s, n in counted.items() if n} == dict(plain)

        after = dispatch_every_state(engine, url, tmp_path, before)
        assert set(after) == set(ROWS)
        assert gauges.refresh(engine)["applied"] == sum(
            1 for r in after.values() if r["status"] == "applied")
    finally:
        engine.dispose()


@pytest.mark.postgres
def test_a_plain_sql_rows_digest_is_stored_without_calling_the_rule(pg_url: str) -> None:
    """The record stores the digest of a row staged by plain SQL: the trigger's ``WHEN``
    lets it through without a call to the PL/pgSQL function (counted by
    ``pg_stat_xact_user_functions``); a changed payload still calls it (retention's purge,
    which it allows), and a changed digest is still refused."""
    engine = db.create_engine(pg_url)
    try:
        with engine.begin() as conn:
            conn.execute(sa.text(
                "INSERT INTO outbox_operations (tenant_id, task_id, operation_id, provider,"
                " payload) VALUES ('t', 'k', 'op-1', 'sink', '{\"n\": 1}')"))
        calls = sa.text(
            "SELECT coalesce(sum(calls), 0) FROM pg_stat_xact_user_functions"
            " WHERE funcname = 'outbox_operations_immutable'")
        with engine.begin() as conn:
            conn.execute(sa.text("SET LOCAL track_functions = 'pl'"))
            conn.execute(sa.text(
                "UPDATE outbox_operations SET payload_digest ="
                " coalesce(payload_digest, 'sha256:abc') WHERE operation_id = 'op-1'"))
            assert conn.execute(calls).scalar_one() == 0
        with engine.begin() as conn:  # retention's purge: the function is asked, allows it
            conn.execute(sa.text("SET LOCAL track_functions = 'pl'"))
            conn.execute(sa.text("SET LOCAL outbox.retention_purge = 'on'"))
            conn.execute(sa.text(
                "UPDATE outbox_operations SET payload = 'null'::jsonb,"
                " payload_purged_at = now() WHERE operation_id = 'op-1'"))
            assert conn.execute(calls).scalar_one() == 1
        with engine.begin() as conn, pytest.raises(sa.exc.IntegrityError,
                                                   match="immutable column"):
            conn.execute(sa.text(
                "UPDATE outbox_operations SET payload_digest = 'sha256:other'"
                " WHERE operation_id = 'op-1'"))
    finally:
        engine.dispose()
