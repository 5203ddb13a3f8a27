"""SQLite's plans for the statements whose cost grew with the table: the claim reads the
pending rows' partial index in id order and stops after one batch (no sort of every
pending row); the record's read-back and every look-up of a batch's (id, revision) or
(tenant, task) pairs search an index (SQLite scans for a row value ``IN`` a list).
Asked of SQLite itself (``EXPLAIN QUERY PLAN``) on a migrated file with a backlog."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Engine

from dispatcher.store.common import fenced, moved_by
from dispatcher.store.sqlite import (
    SQLiteStore,
    claim_statement,
    claimable,
    events_statement,
    held_claim_statement,
    mark_statement,
    task_limits_statement,
)
from dispatcher.store.transitions import Transition
from outbox import db, schema
from outbox.states import OperationStatus
from outbox.types import in_pairs
from tests.dispatcher import stage

S = OperationStatus
ops = schema.operations


@pytest.fixture
def lite(sqlite_url: str) -> Iterator[Engine]:
    eng = db.create_engine(sqlite_url)
    stage(eng, 50)
    yield eng
    eng.dispose()


def plan(engine: Engine, statement: sa.Select[object]) -> str:
    sql = statement.compile(dialect=engine.dialect, compile_kwargs={"literal_binds": True})
    with engine.connect() as conn:
        return "\n".join(str(r[-1]) for r in conn.exec_driver_sql(f"EXPLAIN QUERY PLAN {sql}"))


def test_the_claim_reads_pending_rows_in_id_order_through_their_index(lite: Engine) -> None:
    text = plan(lite, claimable(10))
    assert "USING INDEX ix_outbox_operations_pending_id" in text, text
    assert "TEMP B-TREE" not in text, text


def test_the_claim_still_takes_the_oldest_pending_rows(lite: Engine) -> None:
    with lite.begin() as conn:
        token, rows, _ = SQLiteStore().claim(conn, worker="w", limit=10, lease_seconds=30)
    assert [r.operation_id for r in rows] == [f"op-{i:05d}" for i in range(10)]
    assert token > 0


@pytest.mark.parametrize(("table", "columns", "index"), [
    ("tasks", ("tenant_id", "task_id"), "(tenant_id=? AND task_id=?)"),
    ("operations", ("tenant_id", "task_id"), "ix_outbox_operations_task (tenant_id=?"),
    ("approvals", ("tenant_id", "operation_id"), "(tenant_id=? AND operation_id=?)"),
])
def test_pairs_are_looked_up_through_an_index(
    lite: Engine, table: str, columns: tuple[str, str], index: str
) -> None:
    """The fenced writes (id, revision), the task rows of a batch, a task's spending, the
    approvals of a batch: each searched, never the whole table scanned."""
    t: sa.Table = getattr(schema, table)
    cols = tuple(t.c[c] for c in columns)
    text = plan(lite, sa.select(*cols).where(in_pairs(cols, [(1, 2), (3, 4)])))
    assert index in text and "SCAN" not in text.split("\n")[0], text


def test_fenced_rows_are_found_by_primary_key(lite: Engine) -> None:
    text = plan(lite, sa.select(ops.c.id).where(fenced(7, [(1, 2), (3, 4)], S.CLAIMED)))
    assert "PRIMARY KEY" in text and "SCAN outbox_operations" not in text, text


def test_the_record_read_back_finds_its_rows_by_primary_key(lite: Engine) -> None:
    items = [Transition(i, 1, S.APPLIED, None) for i in range(1, 11)]
    text = plan(lite, moved_by(7, items))
    assert "SCAN outbox_operations" not in text, text
    assert "PRIMARY KEY" in text, text


@pytest.mark.parametrize(("name", "found_by"), [
    ("claim", "INTEGER PRIMARY KEY"),
    ("held claim", "INTEGER PRIMARY KEY"),
    ("mark", "INTEGER PRIMARY KEY"),
    ("held mark", "INTEGER PRIMARY KEY"),
    ("events", "INTEGER PRIMARY KEY"),
    ("held events", "INTEGER PRIMARY KEY"),
    ("task limits", "(tenant_id=? AND task_id=?)"),
])
def test_the_hot_paths_json_batches_are_looked_up_through_an_index(
    lite: Engine, name: str, found_by: str
) -> None:
    """The claim, the dispatching mark, their events and the claim's task rows take a
    batch's ids or pairs as one JSON array: each looks its rows up by key, whatever the
    planner guesses of the array's size (the mark's status test would otherwise draw it to
    the status index, every claimed row of every worker)."""
    statement = {
        "claim": claim_statement(),
        "held claim": held_claim_statement(),
        "mark": mark_statement(),
        "held mark": mark_statement(held=True),
        "events": events_statement(S.PENDING, S.CLAIMED),
        "held events": events_statement(S.PENDING, S.CLAIMED, token=True),
        "task limits": task_limits_statement(),
    }[name]
    sql = str(statement.compile(dialect=lite.dialect))
    with lite.connect() as conn:
        text = "\n".join(str(r[-1]) for r in conn.exec_driver_sql(
            f"EXPLAIN QUERY PLAN {sql}", ("[[1, 2]]",) * sql.count("?")))
    first = text.split("\n")[0]
    assert found_by in first and "SCAN" not in first, text
