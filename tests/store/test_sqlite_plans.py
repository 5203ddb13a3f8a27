"""SQLite's plans for the two statements whose cost grew with the table: the claim reads
the pending rows' partial index in id order and stops after one batch (no sort of every
pending row), and the record's read-back finds its rows by primary key (no table scan).
Asked of SQLite itself (``EXPLAIN QUERY PLAN``) on a migrated file with a backlog."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Engine

from dispatcher.store.common import moved_by
from dispatcher.store.sqlite import SQLiteStore, claimable
from dispatcher.store.transitions import Transition
from outbox import db
from outbox.states import OperationStatus
from tests.dispatcher import stage


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


def test_the_record_read_back_finds_its_rows_by_primary_key(lite: Engine) -> None:
    items = [Transition(i, 1, OperationStatus.APPLIED, None) for i in range(1, 11)]
    text = plan(lite, moved_by(7, items))
    assert "SCAN outbox_operations" not in text, text
    assert "PRIMARY KEY" in text, text
