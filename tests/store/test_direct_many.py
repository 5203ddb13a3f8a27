"""An executemany on the driver's cursor (:func:`dispatcher.store.direct.execute_many`)
stores exactly what ``Connection.execute`` stores — the same text for timestamps, the
same JSON values (``None`` included; on SQLite in orjson's compact text), the same
integers and floats — in the caller's transaction, and a driver error arrives as
SQLAlchemy's class of it. Real SQLite files and the real PostgreSQL."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from dispatcher.store import direct, journal, store_for
from dispatcher.store.common import transition_statement
from outbox import db, schema
from outbox.states import OperationStatus
from tests.dispatcher import stage

ops = schema.operations
S = OperationStatus
WHEN = datetime(2026, 12, 6, 14, 30, 5, 123456, tzinfo=UTC)


@pytest.fixture
def eng(db_url: str) -> Iterator[Engine]:
    e = db.create_engine(db_url)
    yield e
    e.dispose()


def _events(tag: str) -> list[dict[str, Any]]:
    base = {"tenant_id": "t", "task_id": "task", "kind": "transition", "actor": "w",
            "evidence_ref": None, "fencing_token": 7}
    return [
        {**base, "operation_id": f"{tag}-1", "from_status": "dispatching",
         "to_status": "applied", "reason": None, "detail": None},
        {**base, "operation_id": f"{tag}-2", "from_status": None, "to_status": "failed",
         "reason": "http_4xx", "detail": {"b": [1, 2.5, None], "a": "é"},
         "fencing_token": 2**40},
    ]


def _attempts(tag: str) -> list[dict[str, Any]]:
    base = {"tenant_id": "t", "attempt": 1, "fencing_token": 3, "worker": "w",
            "provider": "sink", "status_code": None, "error_class": None,
            "transport_phase": None, "request_digest": None}
    return [
        {**base, "operation_id": f"{tag}-1", "started_at": WHEN,
         "finished_at": WHEN.replace(tzinfo=None), "result_class": "success",
         "duration_ms": 1.25, "evidence": None},
        {**base, "operation_id": f"{tag}-2",
         "started_at": WHEN.astimezone(timezone(timedelta(hours=5, minutes=30))),
         "finished_at": None, "result_class": "retryable", "status_code": 503,
         "duration_ms": None, "evidence": {"status": 503, "headers": {"retry-after": "2"}}},
    ]


def _stored(conn: Connection, table: sa.Table, tag: str) -> list[tuple[Any, ...]]:
    """Every column but the id and created_at as the database holds it (on SQLite with
    its storage class: text and numbers that merely compare equal do not pass; a JSON
    column as its storage class and the value its text decodes to)."""
    cols = [c for c in table.c if c.name not in ("id", "created_at")]
    sqlite = conn.dialect.name == "sqlite"
    shown: list[Any] = []
    json_at: set[int] = set()
    for c in cols:
        col = sa.literal_column(c.name)
        if not sqlite:
            shown.append(sa.cast(col, sa.Text))
        elif isinstance(c.type, sa.JSON):
            shown.append(sa.func.typeof(col))
            json_at.add(len(shown))
            shown.append(col)
        else:
            shown.append(sa.func.quote(col))
    rows = conn.execute(
        sa.select(*shown).select_from(table)
        .where(table.c.operation_id.like(f"{tag}-%")).order_by(table.c.operation_id)
    ).all()
    return [tuple(json.loads(v) if i in json_at and v is not None else str(v).replace(tag, "")
                  for i, v in enumerate(r)) for r in rows]


def test_journal_rows_stored_as_connection_execute_stores_them(eng: Engine) -> None:
    with eng.begin() as conn:
        journal.write(conn, _events("sa"), _attempts("sa"))
        journal.write(conn, _events("dr"), _attempts("dr"), execute_many=direct.execute_many)
    with eng.connect() as conn:
        for table in (schema.events, schema.attempts):
            ours = _stored(conn, table, "dr")
            assert len(ours) == 2
            assert ours == _stored(conn, table, "sa")


def test_a_transition_executemany_matches_connection_execute(eng: Engine) -> None:
    stage(eng, 4)
    store = store_for(eng.dialect.name)
    with eng.begin() as conn:
        claimed = store.claim(conn, worker="w", limit=4, lease_seconds=60)
        token = claimed.token
        marked = store.mark_dispatching(
            conn, token=token, pairs=[(r.id, r.state_revision) for r in claimed.rows],
            lease_seconds=60, actor="w")
    ids = [m.id for m in marked]
    rev = marked[0].state_revision

    def params(i: int, receipt: Any) -> dict[str, Any]:
        return {"b_id": i, "b_rev": rev, "b_token": token, "b_status": "applied",
                "b_reason": None, "b_has_receipt": receipt is not None, "b_receipt": receipt,
                "b_outcome": "success", "b_delay": None, "b_digest": None}

    statement = transition_statement(S.DISPATCHING, False)
    with eng.begin() as conn:
        conn.execute(statement, [params(ids[0], {"id": "r1"}), params(ids[1], None)])
        changed = direct.execute_many(conn, statement, [params(ids[2], {"id": "r1"}),
                                                        params(ids[3], None)])
        stale = direct.execute_many(conn, statement, [params(ids[3], None)])
    assert (changed, stale) == (2, 0)  # the rows changed, over every parameter set
    with eng.connect() as conn:
        shown = [sa.cast(ops.c[c], sa.Text) for c in
                 ("status", "receipt", "last_outcome", "lease_owner", "state_revision")]
        rows = [(s, json.loads(r) if r else r, *rest) for s, r, *rest
                in conn.execute(sa.select(*shown).order_by(ops.c.id)).all()]
    assert rows[0] == rows[2] and rows[1] == rows[3]
    assert rows[0][0] == rows[1][0] == "applied"
    assert rows[0][1] == {"id": "r1"} and rows[0][3] is None and rows[0][4] == str(rev + 1)


def test_runs_in_the_callers_transaction(eng: Engine) -> None:
    with eng.connect() as conn:
        with conn.begin() as tx:
            direct.execute_many(conn, journal.INSERT_EVENTS, _events("gone"))
            tx.rollback()
        with conn.begin():
            direct.execute_many(conn, journal.INSERT_EVENTS, _events("kept"))
        assert len(_stored(conn, schema.events, "kept")) == 2
        assert _stored(conn, schema.events, "gone") == []


def test_a_driver_error_is_sqlalchemys_class_with_parameters_hidden(eng: Engine) -> None:
    missing_actor = [{**e, "actor": None} for e in _events("bad")]
    with eng.connect() as conn, pytest.raises(sa.exc.IntegrityError) as caught:
        direct.execute_many(conn, journal.INSERT_EVENTS, missing_actor)
    assert not caught.value.connection_invalidated
    assert not db.is_outage(caught.value)
    assert "parameters hidden" in str(caught.value)


def test_nothing_to_write_runs_nothing(eng: Engine) -> None:
    with eng.connect() as conn:
        direct.execute_many(conn, sa.text("not sql at all"), [])


def test_a_statement_its_types_cannot_bind_plainly_is_refused(eng: Engine) -> None:
    statement = sa.select(ops.c.id).where(ops.c.id.in_(sa.bindparam("ids", expanding=True)))
    with eng.connect() as conn, pytest.raises(TypeError, match="plain parameters"):
        direct.execute_many(conn, statement, [{"ids": [1, 2]}])
