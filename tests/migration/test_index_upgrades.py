"""Migrations that rebuild indexes and change no row: 0004 (the status index holds only
rows at rest), 0005 (BRIN for the append-only tables' ``created_at`` on PostgreSQL) and 0007
(the task index ends with the row's id).
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
TASK_INDEX = "ix_outbox_operations_task"
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


def _task_index_by_id(engine: Engine, upgraded: bool) -> None:
    columns = _index_definition(engine, TASK_INDEX).split("(", 1)[1].replace('"', "")
    assert columns.startswith("TENANT_ID, TASK_ID"), columns
    assert ("TASK_ID, ID)" in columns) == upgraded, columns
    with engine.connect() as conn:  # a task's rows are found through it, by its prefix
        if engine.dialect.name == "sqlite":
            plan = " ".join(str(r[-1]) for r in conn.exec_driver_sql(
                "EXPLAIN QUERY PLAN SELECT id FROM outbox_operations"
                " WHERE tenant_id = 't' AND task_id = 'k' ORDER BY id"))
            assert TASK_INDEX in plan and "TEMP B-TREE" not in plan.upper(), plan
        else:
            conn.exec_driver_sql("SET LOCAL enable_seqscan = off")
            plan = " ".join(str(r[0]) for r in conn.exec_driver_sql(
                "EXPLAIN SELECT id FROM outbox_operations"
                " WHERE tenant_id = 't' AND task_id = 'k'"))
            assert TASK_INDEX in plan, plan


CASES: dict[str, tuple[str, Callable[[Engine, bool], None]]] = {
    "0004": ("0003", _status_index_at_rest),
    "0005": ("0004", _brin_on_postgresql),
    "0007": ("0006", _task_index_by_id),
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
