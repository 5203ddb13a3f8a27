"""One conformance suite for both stores (the ``engine`` fixture is each dialect in turn):
claims (eligibility, order, exclusivity, one fresh token per batch), the dispatching mark
(fenced on token, revision and status; deadlines and cancellation on the database clock),
recording (fenced, events and attempt rows), plain transitions, lease extension, the
fencing counter and the database clock, retention, the server. Real databases; no daemon."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from dispatcher.config import RetentionConfig
from dispatcher.store import Store, journal, store_for
from dispatcher.store.transitions import Recorded, Transition
from outbox.api import cancel_task
from outbox.ddl import NOTIFY_CHANNEL
from outbox.records import OperationRecord
from outbox.states import OperationStatus
from tests.dispatcher import TENANT, events_of, operation, rows, stage

S = OperationStatus
LEASE = 30.0


@pytest.fixture
def store(engine: Engine) -> Store:
    return store_for(engine.dialect.name)


@contextmanager
def tx(engine: Engine) -> Iterator[Connection]:
    with engine.begin() as conn:
        yield conn


def claim(engine: Engine, store: Store, limit: int = 100,
          worker: str = "w1") -> tuple[int, list[OperationRecord]]:
    with tx(engine) as conn:
        token, rows, _ = store.claim(conn, worker=worker, limit=limit, lease_seconds=LEASE)
    return token, rows


def mark(engine: Engine, store: Store, token: int, ops: list[OperationRecord],
         *, revision_offset: int = 0) -> list[int]:
    with tx(engine) as conn:
        marked = store.mark_dispatching(
            conn, token=token, pairs=[(o.id, o.state_revision + revision_offset) for o in ops],
            lease_seconds=LEASE, actor="w1")
    return [m.id for m in marked]


def sql(engine: Engine, text: str, **params: object) -> None:
    with engine.begin() as conn:
        conn.execute(sa.text(text), params)


def moves(engine: Engine, operation_id: str) -> list[tuple[str | None, str | None, str | None]]:
    return [(e["from_status"], e["to_status"], e["actor"]) for e in events_of(engine, operation_id)]


def test_claim_takes_eligible_rows_oldest_first_under_one_fresh_token(
    engine: Engine, store: Store
) -> None:
    ids = stage(engine, 5)
    token, first = claim(engine, store, limit=3)
    assert [o.operation_id for o in first] == ids[:3]
    assert token > 0 and {o.fencing_token for o in first} == {token}
    for o in first:
        row = operation(engine, o.operation_id)
        assert (row["status"], row["lease_owner"], row["fencing_token"]) == ("claimed", "w1", token)
        assert row["lease_expires_at"] > row["updated_at"]
        assert moves(engine, o.operation_id)[-1] == ("pending", "claimed", "w1")
    token2, rest = claim(engine, store)
    assert [o.operation_id for o in rest] == ids[3:] and token2 > token
    assert claim(engine, store) == (0, [])


def test_fencing_tokens_only_grow(engine: Engine, store: Store) -> None:
    with tx(engine) as conn:
        tokens = [store.fencing_token(conn) for _ in range(5)]
    assert tokens == sorted(set(tokens))
    stage(engine, 1)
    token, _ = claim(engine, store)
    assert token > tokens[-1]


def test_claim_skips_rows_not_due_of_cancelled_tasks_and_behind_their_ordering_key(
    engine: Engine, store: Store
) -> None:
    first, _second = stage(engine, 2, prefix="ordered", ordering_key="k")
    (later,) = stage(engine, 1, prefix="later")
    sql(engine, "UPDATE outbox_operations SET next_attempt_at = :t WHERE operation_id = :o",
        t=datetime.now(UTC) + timedelta(hours=1), o=later)
    stage(engine, 1, prefix="doomed", task="doomed-task")
    # cancelled while its row is still pending (cancel_task would also move the row)
    sql(engine, "UPDATE outbox_tasks SET cancelled_at = :t WHERE task_id = 'doomed-task'",
        t=datetime.now(UTC))
    _, claimed = claim(engine, store)
    assert [o.operation_id for o in claimed] == [first]
    assert claim(engine, store) == (0, [])  # the second waits for the first to end


def test_two_claims_never_take_the_same_row(engine: Engine, store: Store) -> None:
    """PostgreSQL: a claim in an open transaction skips the rows another holds (SKIP
    LOCKED) without waiting for it; SQLite: claims are serial (one writer)."""
    ids = stage(engine, 6)
    if engine.dialect.name == "postgresql":
        with engine.connect() as a:
            _, first, _ = store.claim(a, worker="a", limit=3, lease_seconds=LEASE)
            result: list[OperationRecord] = []
            other = threading.Thread(
                target=lambda: result.extend(claim(engine, store, worker="b")[1]))
            other.start()
            other.join(timeout=10)
            assert not other.is_alive(), "the second claim waited for the first"
            a.commit()
        second = result
    else:
        _, first = claim(engine, store, limit=3, worker="a")
        _, second = claim(engine, store, worker="b")
    assert sorted(o.operation_id for o in first + second) == ids
    assert not {o.id for o in first} & {o.id for o in second}


def test_the_mark_is_fenced_on_token_revision_and_status(engine: Engine, store: Store) -> None:
    stage(engine, 2)
    token, claimed = claim(engine, store)
    assert mark(engine, store, token - 1, claimed) == []  # an older token: matches nothing
    assert mark(engine, store, token, claimed, revision_offset=-1) == []  # a stale revision
    assert mark(engine, store, token, claimed) == [o.id for o in claimed]
    assert mark(engine, store, token, claimed) == []  # no longer claimed
    for o in claimed:
        row = operation(engine, o.operation_id)
        assert (row["status"], row["attempts"]) == ("dispatching", 1)
        assert row["state_revision"] == o.state_revision + 1
        assert row["first_dispatched_at"] == row["last_attempt_started_at"]
        assert moves(engine, o.operation_id)[-1] == ("claimed", "dispatching", "w1")


def test_the_mark_leaves_passed_deadlines_and_cancelled_tasks_and_says_why(
    engine: Engine, store: Store
) -> None:
    (late,) = stage(engine, 1, prefix="late")
    (cancelled,) = stage(engine, 1, prefix="cancelled", task="cancelled-task")
    (fine,) = stage(engine, 1, prefix="fine")
    token, claimed = claim(engine, store)
    sql(engine, "UPDATE outbox_operations SET deadline_at = :t WHERE operation_id = :o",
        t=datetime.now(UTC) - timedelta(seconds=1), o=late)
    with engine.begin() as conn:
        cancel_task(conn, tenant_id=TENANT, task_id="cancelled-task", actor="test")
    by_name = {o.operation_id: o for o in claimed}
    assert mark(engine, store, token, claimed) == [by_name[fine].id]
    with tx(engine) as conn:
        reasons = store.refusal_reasons(conn, [by_name[late].id, by_name[cancelled].id])
    assert reasons == {by_name[late].id: (S.BLOCKED, "deadline_passed"),
                       by_name[cancelled].id: (S.CANCELLED, "task_cancelled")}


def _recorded(op: OperationRecord, token: int, status: OperationStatus) -> Recorded:
    now = datetime.now(UTC)
    return Recorded(
        op=op,
        transition=Transition(op.id, op.state_revision + 1, status,
                              receipt={"id": op.operation_id}, last_outcome="applied"),
        detail=None,
        attempt=journal.attempt(op, attempt_no=1, token=token, worker="w1",
                                result_class="applied", started_at=now, finished_at=now,
                                evidence={"status": 200}),
        token=token,
    )


def test_recording_is_fenced_and_writes_events_and_attempts(engine: Engine, store: Store) -> None:
    stage(engine, 2)
    token, claimed = claim(engine, store)
    mark(engine, store, token, claimed)
    mine, stale = claimed
    with tx(engine) as conn:
        moved = store.record_many(conn, items=[_recorded(mine, token, S.APPLIED)], actor="w1")
        fenced = store.record_many(conn, items=[_recorded(stale, token - 1, S.APPLIED)],
                                   actor="w1")
    assert (moved, fenced) == ({mine.id}, set())
    row = operation(engine, mine.operation_id)
    assert (row["status"], row["receipt"], row["lease_owner"]) == (
        "applied", {"id": mine.operation_id}, None)
    assert moves(engine, mine.operation_id)[-1] == ("dispatching", "applied", "w1")
    assert operation(engine, stale.operation_id)["status"] == "dispatching"
    attempts = {a["operation_id"]: a for a in rows(engine, "SELECT * FROM outbox_attempts")}
    assert attempts[mine.operation_id]["result_class"] == "applied"
    evidence = attempts[stale.operation_id]["evidence"]
    assert (evidence if isinstance(evidence, dict) else json.loads(evidence)) == {
        "status": 200, "fenced": True}


def test_one_record_holds_several_batches_each_fenced_on_its_own_token(
    engine: Engine, store: Store
) -> None:
    """The sends of two claimed batches recorded in one call (on PostgreSQL one statement,
    one commit): each row's write is fenced on its own batch's token, and its event and
    attempt row carry that token; an item under a token its row no longer holds is fenced
    while the others move."""
    stage(engine, 2, prefix="b1")
    first, (a, b) = claim(engine, store, limit=2)
    mark(engine, store, first, [a, b])
    stage(engine, 1, prefix="b2")
    second, (c,) = claim(engine, store, limit=1)
    mark(engine, store, second, [c])
    assert first != second
    with tx(engine) as conn:
        moved = store.record_many(conn, actor="w1", items=[
            _recorded(a, first, S.APPLIED), _recorded(c, second, S.APPLIED),
            _recorded(b, second, S.APPLIED)])  # b was sent under `first`, not `second`
    assert moved == {a.id, c.id}
    assert [operation(engine, o.operation_id)["status"] for o in (a, b, c)] == [
        "applied", "dispatching", "applied"]
    tokens = {e["operation_id"]: e["fencing_token"] for e in rows(
        engine, "SELECT * FROM outbox_events WHERE to_status = 'applied'")}
    assert tokens == {a.operation_id: first, c.operation_id: second}
    attempts = {t["operation_id"]: t for t in rows(engine, "SELECT * FROM outbox_attempts")}
    assert {k: t["fencing_token"] for k, t in attempts.items()} == {
        a.operation_id: first, b.operation_id: second, c.operation_id: second}
    evidence = attempts[b.operation_id]["evidence"]
    assert (evidence if isinstance(evidence, dict) else json.loads(evidence)) == {
        "status": 200, "fenced": True}


def test_plain_transitions_are_fenced(engine: Engine, store: Store) -> None:
    stage(engine, 2)
    token, (a, b) = claim(engine, store)
    items = [Transition(a.id, a.state_revision, S.BLOCKED, "test"),
             Transition(b.id, b.state_revision - 1, S.BLOCKED, "test")]
    with tx(engine) as conn:
        assert store.transition_many(conn, token=token, expected=S.CLAIMED, items=items) == {a.id}
        assert store.transition_many(
            conn, token=token + 1, expected=S.CLAIMED,
            items=[Transition(b.id, b.state_revision, S.BLOCKED, "test")]) == set()
    assert operation(engine, a.operation_id)["status_reason"] == "test"
    assert operation(engine, b.operation_id)["status"] == "claimed"


def test_leases_extend_only_under_their_token(engine: Engine, store: Store) -> None:
    stage(engine, 1)
    token, claimed = claim(engine, store)
    mark(engine, store, token, claimed)
    (op,) = claimed
    pairs = [(op.id, op.state_revision + 1)]
    before = operation(engine, op.operation_id)["lease_expires_at"]
    with tx(engine) as conn:
        assert store.extend_leases(conn, token=token - 1, pairs=pairs, lease_seconds=600) == set()
        assert store.extend_leases(conn, token=token, pairs=pairs, lease_seconds=600) == {op.id}
    after = operation(engine, op.operation_id)
    assert after["lease_expires_at"] > before + timedelta(seconds=500)
    assert after["state_revision"] == op.state_revision + 1  # not a transition


def test_the_database_clock(engine: Engine, store: Store) -> None:
    with tx(engine) as conn:
        first = store.db_now(conn)
    with tx(engine) as conn:
        second = store.db_now(conn)
    assert first.tzinfo is not None and first <= second
    assert abs(second - datetime.now(UTC)) < timedelta(seconds=60)


# -- the repair paths ------------------------------------------------------------------
def _expire(engine: Engine, *operation_ids: str) -> None:
    for op_id in operation_ids:
        sql(engine, "UPDATE outbox_operations SET lease_expires_at = :t WHERE operation_id = :o",
            t=datetime.now(UTC) - timedelta(seconds=5), o=op_id)


def test_expired_leases_go_back_to_pending_or_to_unknown_never_resent(
    engine: Engine, store: Store
) -> None:
    """An expired ``claimed`` row was never sent: ``pending``. An expired ``dispatching``
    row may have been: ``unknown`` (last outcome ``lost``), never ``pending``. A lease
    renewed in time, or a revision moved on since the read, keeps the row where it is."""
    ids = stage(engine, 4)
    token, (never_sent, maybe_sent, renewed, moved_on) = claim(engine, store)
    mark(engine, store, token, [maybe_sent, renewed, moved_on])
    _expire(engine, *ids)
    with tx(engine) as conn:
        expired = store.expired_leases(conn, limit=10)
    assert sorted(o.operation_id for o in expired) == ids
    with tx(engine) as conn:  # renewed in time: its lease no longer expired
        store.extend_leases(conn, token=token, pairs=[(renewed.id, renewed.state_revision + 1)],
                            lease_seconds=600)
        store.transition_many(conn, token=token, expected=S.DISPATCHING, items=[
            Transition(moved_on.id, moved_on.state_revision + 1, S.APPLIED)])
    with tx(engine) as conn:
        recovered = store.recover_leases(conn, expired)
    assert {o.operation_id: o.status for o in recovered} == {
        never_sent.operation_id: S.PENDING, maybe_sent.operation_id: S.UNKNOWN}
    row = operation(engine, maybe_sent.operation_id)
    assert (row["status_reason"], row["last_outcome"], row["lease_owner"]) == (
        "lease_expired_while_dispatching", "lost", None)
    assert operation(engine, renewed.operation_id)["status"] == "dispatching"
    assert operation(engine, moved_on.operation_id)["status"] == "applied"
    with tx(engine) as conn:
        assert store.expired_leases(conn, limit=10) == []


def _unknown(engine: Engine, store: Store, count: int = 1) -> list[OperationRecord]:
    ids = stage(engine, count, prefix="u")
    token, claimed = claim(engine, store)
    mark(engine, store, token, claimed)
    _expire(engine, *ids)
    with tx(engine) as conn:
        return store.recover_leases(conn, store.expired_leases(conn, limit=100))


def test_unknown_rows_are_resolved_once_on_the_revision_read(
    engine: Engine, store: Store
) -> None:
    first, second = _unknown(engine, store, 2)
    with tx(engine) as conn:
        due = store.unknown_due(conn, limit=10)
    assert [o.id for o in due] == [first.id, second.id]
    with tx(engine) as conn:
        assert store.resolve_unknown(conn, row=first, status=S.APPLIED, reason=None,
                                     receipt={"found": True}, last_outcome="reconciled_applied")
        # a second resolution of the same read (a concurrent reconciler) matches nothing
        assert not store.resolve_unknown(conn, row=first, status=S.PENDING, reason="late")
        assert store.resolve_unknown(conn, row=second, status=S.PENDING,
                                     reason="reconciled_not_applied", delay_seconds=0.0)
    row = operation(engine, first.operation_id)
    assert (row["status"], row["receipt"], row["last_outcome"]) == (
        "applied", {"found": True}, "reconciled_applied")
    assert operation(engine, second.operation_id)["status"] == "pending"


def test_a_look_up_scheduled_later_is_not_due(engine: Engine, store: Store) -> None:
    (row,) = _unknown(engine, store)
    with tx(engine) as conn:
        store.look_again(conn, row=row, delay_seconds=3600)
    with tx(engine) as conn:
        assert store.unknown_due(conn, limit=10) == []
    after = operation(engine, row.operation_id)
    assert (after["status"], after["state_revision"]) == ("unknown", row.state_revision)


def test_a_claim_returns_the_task_rows_of_its_rows(engine: Engine, store: Store) -> None:
    """The authority's checks read each row's task (version, budgets) from the claim: on
    PostgreSQL the claim statement itself joins them, so a batch that needs no lock is
    checked and marked without another round trip."""
    stage(engine, 2, prefix="budgeted", task="budgeted-task")
    stage(engine, 1, prefix="free", task="free-task")
    sql(engine, "UPDATE outbox_tasks SET max_attempts = 4 WHERE task_id = 'budgeted-task'")
    sql(engine, "INSERT INTO outbox_operations (tenant_id, task_id, operation_id, provider, "
                "payload) VALUES (:t, 'no-task-row', 'plain-sql', 'sim', '{}')", t=TENANT)
    with tx(engine) as conn:
        claimed = store.claim(conn, worker="w1", limit=10, lease_seconds=LEASE)
    assert len(claimed.rows) == 4
    assert sorted(claimed.tasks) == [(TENANT, "budgeted-task"), (TENANT, "free-task")]
    budgeted = claimed.tasks[(TENANT, "budgeted-task")]
    assert (budgeted["max_attempts"], budgeted["max_elapsed_seconds"]) == (4, None)


# -- the authority's reads and writes --------------------------------------------------
def test_task_limits_and_the_attempts_a_task_has_spent(engine: Engine, store: Store) -> None:
    stage(engine, 2, prefix="budgeted", task="budgeted-task")
    stage(engine, 1, prefix="free", task="free-task")
    sql(engine, "UPDATE outbox_tasks SET max_attempts = 5 WHERE task_id = 'budgeted-task'")
    token, claimed = claim(engine, store)
    mark(engine, store, token, [o for o in claimed if o.task_id == "budgeted-task"])
    pairs = [(TENANT, "budgeted-task"), (TENANT, "free-task"), (TENANT, "no-such-task")]
    with tx(engine) as conn:
        limits = store.task_limits(conn, pairs, lock_budgeted=True)
        spent = store.task_spending(conn, pairs[:1])
    assert sorted(limits) == sorted(pairs[:2])
    assert limits[(TENANT, "budgeted-task")]["max_attempts"] == 5
    assert limits[(TENANT, "free-task")]["max_attempts"] is None
    attempts, first = spent[(TENANT, "budgeted-task")]
    assert attempts == 2 and first is not None


def test_approvals_are_read_and_consumed_once(engine: Engine, store: Store) -> None:
    from outbox import approvals

    (op_id,) = stage(engine, 1, prefix="approved", requires_approval=True)
    with engine.begin() as conn:
        approvals.approve(conn, tenant_id=TENANT, operation_id=op_id, actor="reviewer")
    with tx(engine) as conn:
        (found,) = store.approvals_for(conn, [(TENANT, op_id), (TENANT, "other")])
    assert (found["operation_id"], found["consumed_at"]) == (op_id, None)
    with tx(engine) as conn:
        assert store.consume_approvals(conn, [found["id"]], 7) == {found["id"]}
        assert store.consume_approvals(conn, [found["id"]], 8) == set()  # once
    with tx(engine) as conn:
        (after,) = store.approvals_for(conn, [(TENANT, op_id)])
    assert after["consumed_fencing_token"] == 7 and after["consumed_at"] is not None


# -- the verifier, the cluster's jobs, the gauges ----------------------------------------
def _applied(engine: Engine, store: Store, count: int) -> list[OperationRecord]:
    stage(engine, count, prefix="v")
    token, claimed = claim(engine, store)
    mark(engine, store, token, claimed)
    with tx(engine) as conn:
        store.record_many(conn, actor="w1",
                          items=[_recorded(o, token, S.APPLIED) for o in claimed])
        return store.verification_due(conn, ["sim"], limit=10)


def test_verification_is_recorded_once_on_the_revision_read(engine: Engine, store: Store) -> None:
    good, bad, later = _applied(engine, store, 3)
    with tx(engine) as conn:
        assert store.verification_due(conn, ["other-provider"], limit=10) == []
        assert store.record_verification(conn, row=good, verified=True)
        assert not store.record_verification(conn, row=good, verified=False)  # moved on
        assert store.record_verification(conn, row=bad, verified=False)
        store.verify_later(conn, row=later, delay_seconds=3600)
    with tx(engine) as conn:
        assert store.verification_due(conn, ["sim"], limit=10) == []  # failed, or not yet
    assert operation(engine, good.operation_id)["status"] == "verified"
    failed = operation(engine, bad.operation_id)
    assert (failed["status"], failed["status_reason"]) == ("applied", "verification_failed")
    with tx(engine) as conn:
        store.publish_verifiers(conn, {"sim": True, "other": False})
        store.publish_verifiers(conn, {"sim": False})  # published again: replaced
    published = {r["name"]: r["value"] for r in rows(
        engine, "SELECT name, value FROM outbox_meta WHERE name LIKE 'verifier:%'")}
    assert published == {"verifier:sim": "0", "verifier:other": "0"}


def test_a_cluster_lock_is_held_by_one_transaction_at_a_time(
    engine: Engine, store: Store
) -> None:
    """PostgreSQL: an advisory lock that ends with its transaction; SQLite has one writer
    at a time anyway, so the lock is always had."""
    key = 0x6F7574626F7800FF
    with tx(engine) as first:
        assert store.take_cluster_lock(first, key)
        if engine.dialect.name == "postgresql":
            with tx(engine) as second:
                assert not store.take_cluster_lock(second, key)
    with tx(engine) as again:
        assert store.take_cluster_lock(again, key)


def test_the_gauges_counts(engine: Engine, store: Store) -> None:
    stage(engine, 3)
    token, (a, b) = claim(engine, store, limit=2)
    with tx(engine) as conn:
        store.transition_many(conn, token=token, expected=S.CLAIMED, items=[
            Transition(a.id, a.state_revision, S.BLOCKED, "approval_missing"),
            Transition(b.id, b.state_revision, S.BLOCKED, None)])
    with tx(engine) as conn:
        counts = store.count_by_status(conn, [S.PENDING, S.BLOCKED, S.UNKNOWN])
        reasons = store.blocked_by_reason(conn)
        age = store.oldest_due_pending_age(conn)
    assert counts == {"pending": 1, "blocked": 2, "unknown": 0}
    assert reasons == {"approval_missing": 1, "unspecified": 1}
    assert 0.0 <= age < 60


def test_replication_is_read_where_there_is_a_server(engine: Engine, store: Store) -> None:
    with tx(engine) as conn:
        found = store.replication(conn)
    if engine.dialect.name == "sqlite":
        assert found is None
        return
    assert found is not None
    standbys, names, commit = found
    assert standbys == 0 and names == "" and commit in ("on", "off", "local", "remote_write",
                                                         "remote_apply")


def test_a_purge_changes_evidence_only_through_the_retention_path(
    engine: Engine, store: Store
) -> None:
    """A finished operation's payload is replaced by ``null`` (its digest kept) only inside
    the store's retention path; the same write outside it is refused by the database."""
    stage(engine, 1)
    token, (op,) = claim(engine, store)
    mark(engine, store, token, [op])
    with tx(engine) as conn:
        store.record_many(conn, items=[_recorded(op, token, S.APPLIED)], actor="w1")
    with pytest.raises(sa.exc.DBAPIError), tx(engine) as conn:
        conn.execute(sa.text("UPDATE outbox_operations SET payload = 'null' WHERE id = :id"),
                     {"id": op.id})
    periods = RetentionConfig(payload_days=1, receipt_days=1)
    later = datetime.now(UTC) + timedelta(days=2)
    with tx(engine) as conn:
        assert store.purge(conn, periods, now=later, dry_run=True).payloads == 1
    assert operation(engine, op.operation_id)["payload_purged_at"] is None
    with tx(engine) as conn:
        counts = store.purge(conn, periods, now=later)
    assert (counts.payloads, counts.receipts) == (1, 1)
    row = operation(engine, op.operation_id)
    assert row["payload_purged_at"] is not None and row["receipt"] is None
    assert row["payload_digest"] and row["status"] == "applied"
    with tx(engine) as conn:  # idempotent
        assert store.purge(conn, periods, now=later).payloads == 0


def test_where_the_server_is_and_how_new_rows_are_heard(engine: Engine, store: Store) -> None:
    with tx(engine) as conn:
        port = store.server_port(conn)
    if engine.dialect.name == "sqlite":
        assert (port, store.listen_statement) == (None, None)
        return
    assert port == engine.url.port
    assert store.listen_statement == f"LISTEN {NOTIFY_CHANNEL}"
