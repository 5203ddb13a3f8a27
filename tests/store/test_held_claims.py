"""Held claims: a claim whose transaction goes on to mark. Its rows stay ``pending`` until
that transaction ends; it shows them as claimed under a fresh token; the mark and the
refusals of the same transaction move them on and set the token; a transaction that never
commits leaves no trace. On PostgreSQL the rows are locked and another worker's claim
skips them without waiting; on SQLite the transaction is the one writer. Real databases;
no daemon."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Engine

from dispatcher.store import journal, store_for
from dispatcher.store.transitions import Transition
from outbox import db, schema
from outbox.records import OperationRecord
from outbox.states import OperationStatus
from tests.dispatcher import events_of, operation, stage, transitions
from tests.support.daemon import wait_until

S = OperationStatus
LEASE = 30.0


@pytest.fixture
def pg(pg_url: str) -> Iterator[Engine]:
    engine = db.create_engine(pg_url)
    yield engine
    engine.dispose()


def _claim_elsewhere(engine: Engine) -> list[OperationRecord]:
    found: list[OperationRecord] = []

    def run() -> None:
        with engine.begin() as conn:
            found.extend(store_for(engine.dialect.name).claim(
                conn, worker="b", limit=100, lease_seconds=LEASE).rows)

    other = threading.Thread(target=run)
    other.start()
    other.join(timeout=10)
    assert not other.is_alive(), "the other claim waited for the held rows"
    return found


def test_held_claim_shows_claimed_rows_and_stores_them_pending(engine: Engine) -> None:
    pg = engine
    store = store_for(engine.dialect.name)
    ids = stage(pg, 4)
    before = {i: operation(pg, i)["state_revision"] for i in ids}
    with pg.begin() as conn:
        token, rows, task_rows = store.claim(
            conn, worker="w1", limit=3, lease_seconds=LEASE, held=True)
        assert [r.operation_id for r in rows] == ids[:3] and token > 0
        for r in rows:  # shown as the claim leaves them
            assert (r.status, r.fencing_token, r.lease_owner) == (S.CLAIMED, token, "w1")
            assert r.lease_expires_at is not None and r.lease_expires_at > r.updated_at
            assert r.state_revision == before[r.operation_id]  # as stored
        assert set(task_rows) == {(r.tenant_id, r.task_id) for r in rows}
        if engine.dialect.name == "postgresql":
            # stored pending, locked: another worker takes only the fourth, without waiting
            assert [r.operation_id for r in _claim_elsewhere(pg)] == ids[3:]
        marked = store.mark_dispatching(
            conn, token=token, pairs=[(r.id, r.state_revision) for r in rows[:2]],
            lease_seconds=LEASE, actor="w1", held=True)
        assert {m.id for m in marked} == {r.id for r in rows[:2]}
        refused = rows[2]
        moved = store.transition_many(conn, token=token, expected=S.CLAIMED, held=True, items=[
            Transition(refused.id, refused.state_revision, S.BLOCKED, "approval_missing")])
        assert moved == {refused.id}
        journal.write(conn, [journal.event(refused, from_status="claimed", to_status="blocked",
                                           reason="approval_missing", actor="w1",
                                           fencing_token=token)])
    for r, m in zip(rows[:2], marked, strict=True):
        row = operation(pg, r.operation_id)
        assert (row["status"], row["fencing_token"], row["lease_owner"]) == (
            "dispatching", token, "w1")
        assert row["state_revision"] == m.state_revision == before[r.operation_id] + 1
        assert row["attempts"] == 1 and row["first_dispatched_at"] is not None
        assert transitions(pg, r.operation_id) == [
            ("pending", "claimed"), ("claimed", "dispatching")]
        assert {e["fencing_token"] for e in events_of(pg, r.operation_id)} == {token}
    row = operation(pg, refused.operation_id)
    assert (row["status"], row["status_reason"], row["fencing_token"]) == (
        "blocked", "approval_missing", token)
    assert row["lease_owner"] is None and row["lease_expires_at"] is None
    assert transitions(pg, refused.operation_id) == [("pending", "claimed"), ("claimed", "blocked")]


def test_a_held_claim_that_never_commits_leaves_no_trace(engine: Engine) -> None:
    pg = engine
    store = store_for(engine.dialect.name)
    ids = stage(pg, 2)
    before = {i: operation(pg, i) for i in ids}
    with pg.connect() as conn:
        conn.begin()
        token, rows, _ = store.claim(conn, worker="w1", limit=10, lease_seconds=LEASE, held=True)
        store.mark_dispatching(conn, token=token, pairs=[(r.id, r.state_revision) for r in rows],
                               lease_seconds=LEASE, actor="w1", held=True)
        conn.rollback()  # a crash before the commit
    assert {i: operation(pg, i) for i in ids} == before
    assert events_of(pg, ids[0]) == [] and events_of(pg, ids[1]) == []
    # nothing to wait out: the next claim takes them at once
    assert [r.operation_id for r in _claim_elsewhere(pg)] == ids


def test_held_mark_and_refusals_match_only_rows_still_pending_at_their_revision(
    engine: Engine,
) -> None:
    pg = engine
    store = store_for(engine.dialect.name)
    stage(pg, 2)
    with pg.begin() as conn:
        token, rows, _ = store.claim(conn, worker="w1", limit=10, lease_seconds=LEASE, held=True)
        stale = [(r.id, r.state_revision + 1) for r in rows]
        assert store.mark_dispatching(conn, token=token, pairs=stale, lease_seconds=LEASE,
                                      actor="w1", held=True) == []
        assert store.transition_many(conn, token=token, expected=S.CLAIMED, held=True, items=[
            Transition(r.id, r.state_revision + 1, S.BLOCKED, "x") for r in rows]) == set()
        conn.execute(sa.update(schema.tasks).values(cancelled_at=sa.func.current_timestamp()))
        assert store.mark_dispatching(  # the task was cancelled: left for refusal_reasons
            conn, token=token, pairs=[(r.id, r.state_revision) for r in rows],
            lease_seconds=LEASE, actor="w1", held=True) == []
        reasons = store.refusal_reasons(conn, [r.id for r in rows], held=True)
        assert reasons == {r.id: (S.CANCELLED, "task_cancelled") for r in rows}


@pytest.mark.postgres
def test_a_held_claim_ends_with_its_lease_when_the_worker_stalls(pg: Engine) -> None:
    """The claim sets the transaction's ``idle_in_transaction_session_timeout`` to the
    lease: a worker stopped while holding rows loses its session, and the rows are free."""
    store = store_for("postgresql")
    ids = stage(pg, 2)
    with pg.connect() as conn:
        _, rows, _ = store.claim(conn, worker="w1", limit=10, lease_seconds=0.5, held=True)
        assert len(rows) == 2
        timeout = conn.execute(sa.text("SHOW idle_in_transaction_session_timeout")).scalar()
        assert timeout == "500ms"
        # stalled: another worker takes the rows once the server has ended the session
        wait_until(lambda: [r.operation_id for r in _claim_elsewhere(pg)] == ids, timeout=10)
        with pytest.raises(sa.exc.DBAPIError, match="idle-in-transaction timeout"):
            conn.execute(sa.text("SELECT 1"))
        conn.invalidate()


@pytest.mark.postgres
def test_claim_and_mark_moves_a_batch_in_one_statement_as_the_two_steps_would(
    pg: Engine,
) -> None:
    """The one-statement path stores what the held claim and its mark store — status,
    token, lease, revision, attempt, both events in order — and shows each row as the
    held claim shows it (``claimed``, revision and attempt as stored before), so the
    checks read the same row either way. Rows another transaction holds are skipped."""
    store = store_for("postgresql")
    ids = stage(pg, 4)
    before = {i: operation(pg, i) for i in ids}
    with pg.begin() as conn:
        got = store.claim_and_mark(conn, worker="w1", limit=3, lease_seconds=LEASE)
        assert got is not None
        (token, rows, task_rows), marks = got
        assert [r.operation_id for r in rows] == ids[:3] and token > 0
        assert set(task_rows) == {(r.tenant_id, r.task_id) for r in rows}
        for r, m in zip(rows, marks, strict=True):
            was = before[r.operation_id]
            assert (r.status, r.fencing_token, r.lease_owner) == (S.CLAIMED, token, "w1")
            assert r.state_revision == was["state_revision"]
            assert (r.attempts, r.first_dispatched_at) == (0, None)
            assert r.lease_expires_at is not None and r.lease_expires_at > r.updated_at
            assert m.id == r.id and m.state_revision == was["state_revision"] + 1
            assert m.attempts == 1 and m.first_dispatched_at == m.last_attempt_started_at
        # locked, not yet committed: another worker takes only the fourth, without waiting
        assert [r.operation_id for r in _claim_elsewhere(pg)] == ids[3:]
    for r, m in zip(rows, marks, strict=True):
        row = operation(pg, r.operation_id)
        assert (row["status"], row["fencing_token"], row["lease_owner"]) == (
            "dispatching", token, "w1")
        assert row["state_revision"] == m.state_revision and row["attempts"] == 1
        assert row["first_dispatched_at"] == m.first_dispatched_at
        assert transitions(pg, r.operation_id) == [
            ("pending", "claimed"), ("claimed", "dispatching")]
        assert {e["fencing_token"] for e in events_of(pg, r.operation_id)} == {token}
        assert {e["actor"] for e in events_of(pg, r.operation_id)} == {"w1"}
    # the batch's events: every claim, then every mark, each in id order (as two steps)
    batch = [e for e in events_of(pg) if e["operation_id"] in ids[:3]]
    assert [(e["operation_id"], e["to_status"]) for e in sorted(batch, key=lambda e: e["id"])] \
        == [(i, "claimed") for i in ids[:3]] + [(i, "dispatching") for i in ids[:3]]


@pytest.mark.postgres
def test_claim_and_mark_says_two_steps_when_a_locked_row_cannot_be_marked(pg: Engine) -> None:
    """A row whose deadline has passed is locked by the claim but not marked: the
    statement says so (``None``), and the rollback leaves no trace of the others."""
    store = store_for("postgresql")
    ids = stage(pg, 3)
    with pg.begin() as conn:
        conn.execute(sa.update(schema.operations)
                     .where(schema.operations.c.operation_id == ids[1])
                     .values(deadline_at=sa.func.now() - sa.text("interval '1 second'")))
    before = {i: operation(pg, i) for i in ids}
    with pg.connect() as conn:
        conn.begin()
        assert store.claim_and_mark(conn, worker="w1", limit=10, lease_seconds=LEASE) is None
        conn.rollback()
    assert {i: operation(pg, i) for i in ids} == before
    assert all(events_of(pg, i) == [] for i in ids)


@pytest.mark.postgres
def test_claim_and_mark_finds_nothing_on_an_empty_table(pg: Engine) -> None:
    store = store_for("postgresql")
    with pg.begin() as conn:
        got = store.claim_and_mark(conn, worker="w1", limit=10, lease_seconds=LEASE)
    assert got is not None
    (token, rows, task_rows), marks = got
    assert (token, rows, task_rows, marks) == (0, [], {}, [])
