"""The agent-side contract, on SQLite and PostgreSQL: the API stages effects inside the
caller's transaction, compare-and-set on the checkpoint, idempotent enqueue, cancellation,
and the constraints the database itself holds.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from outbox import api, errors, schema
from outbox.api import StagedOperation
from outbox.digest import default_idempotency_key, payload_digest
from outbox.states import OperationStatus
from outbox.types import db_now
from tests.support.agents import Agent

from .sqlcli import count, peek

T = "tenant-a"
ops_t, tasks_t, events_t = schema.operations, schema.tasks, schema.events


def url_of(engine: Engine) -> str:
    return engine.url.render_as_string(hide_password=False)


def n_ops(engine: Engine, **where: str) -> int:
    clauses = " AND ".join(f"{k} = %s" for k in where) or "1 = 1"
    return count(
        url_of(engine),
        f"SELECT count(*) FROM outbox_operations WHERE {clauses}",
        tuple(where.values()),
    )


def task_row(engine: Engine, task_id: str, tenant_id: str = T) -> dict[str, Any] | None:
    with engine.connect() as conn:
        row = (
            conn.execute(
                sa.select(tasks_t).where(
                    tasks_t.c.tenant_id == tenant_id, tasks_t.c.task_id == task_id
                )
            )
            .mappings()
            .first()
        )
        conn.rollback()
    return dict(row) if row else None


def op(operation_id: str, **payload: Any) -> StagedOperation:
    return StagedOperation(
        operation_id=operation_id, provider="tickets", payload=payload or {"title": operation_id}
    )


@pytest.fixture
def agent_table(engine: Engine) -> Iterator[str]:
    """The agent's own table, beside the outbox tables in the same database."""
    with engine.begin() as conn:
        conn.exec_driver_sql("CREATE TABLE agent_notes (id INTEGER PRIMARY KEY, note TEXT)")
    yield "agent_notes"


# --------------------------------------------------------------------- transactions


def test_rolled_back_agent_transaction_leaves_no_task_change_and_no_operation(
    agent: Agent, agent_table: str
) -> None:
    with agent.begin() as conn:
        agent.advance(conn, "t1", tenant_id=T, expected_revision=0, phase="start", state={"n": 0})

    class AgentCrashed(Exception):
        pass

    with pytest.raises(AgentCrashed), agent.begin() as conn:
        agent.sql(conn, f"INSERT INTO {agent_table} (id, note) VALUES (1, 'draft')")
        task = agent.advance(
            conn,
            "t1",
            tenant_id=T,
            expected_revision=1,
            phase="ticket",
            state={"n": 1},
            operations=[op("ticket:create:1")],
        )
        assert task.state_revision == 2 and len(task.operations) == 1
        agent.enqueue(
            conn,
            tenant_id=T,
            task_id="t1",
            operation_id="mail:1",
            provider="mail",
            payload={"to": "case-1"},
        )
        raise AgentCrashed

    row = task_row(agent.engine, "t1")
    assert row is not None
    assert (row["state_revision"], row["phase"], row["state"]) == (1, "start", {"n": 0})
    assert n_ops(agent.engine) == 0
    assert count(url_of(agent.engine), f"SELECT count(*) FROM {agent_table}") == 0


def test_advance_creates_the_task_at_revision_zero_and_counts_up(agent: Agent) -> None:
    with agent.begin() as conn:
        created = agent.advance(
            conn,
            "t1",
            tenant_id=T,
            expected_revision=0,
            phase="p0",
            state={"step": 0},
            workflow_version="wf-1",
        )
    assert (created.state_revision, created.phase, created.state) == (1, "p0", {"step": 0})
    assert created.workflow_version == "wf-1" and created.cancelled_at is None
    with agent.begin() as conn:
        moved = agent.advance(
            conn, "t1", tenant_id=T, expected_revision=1, phase="p1", state={"step": 1}
        )
    assert (moved.state_revision, moved.phase, moved.workflow_version) == (2, "p1", "wf-1")
    with agent.connect() as conn:
        loaded = agent.load_task(conn, tenant_id=T, task_id="t1")
    assert (loaded.state_revision, loaded.state) == (2, {"step": 1})
    assert loaded.created_at <= loaded.updated_at


@pytest.mark.parametrize("expected", [0, 1, 3])
def test_stale_revision_raises_conflict_and_writes_nothing(
    agent: Agent, agent_table: str, expected: int
) -> None:
    with agent.begin() as conn:
        agent.advance(conn, "t1", tenant_id=T, expected_revision=0, phase="p0")
        agent.advance(conn, "t1", tenant_id=T, expected_revision=1, phase="p1", state={"k": 1})
    before = task_row(agent.engine, "t1")
    with agent.begin() as conn:  # the caller may still commit its transaction afterwards
        agent.sql(conn, f"INSERT INTO {agent_table} (id, note) VALUES (7, 'kept')")
        with pytest.raises(errors.RevisionConflict) as caught:
            agent.advance(
                conn,
                "t1",
                tenant_id=T,
                expected_revision=expected,
                phase="stale",
                state={"k": 99},
                operations=[op("ticket:create:stale"), op("mail:stale")],
            )
    assert caught.value.expected == expected  # type: ignore[attr-defined]
    assert caught.value.actual == 2  # type: ignore[attr-defined]
    assert task_row(agent.engine, "t1") == before
    assert n_ops(agent.engine) == 0
    assert count(url_of(agent.engine), f"SELECT count(*) FROM {agent_table}") == 1


def test_conflict_on_a_task_that_does_not_exist(agent: Agent) -> None:
    with agent.begin() as conn, pytest.raises(errors.RevisionConflict) as caught:
        agent.advance(conn, "ghost", tenant_id=T, expected_revision=4, operations=[op("x")])
    assert caught.value.actual is None  # type: ignore[attr-defined]
    assert task_row(agent.engine, "ghost") is None and n_ops(agent.engine) == 0


def test_invalid_operation_in_advance_writes_nothing(agent: Agent) -> None:
    with agent.begin() as conn:
        agent.advance(conn, "t1", tenant_id=T, expected_revision=0, phase="p0")
    before = task_row(agent.engine, "t1")
    with agent.begin() as conn, pytest.raises(errors.SecretInPayload):
        agent.advance(
            conn,
            "t1",
            tenant_id=T,
            expected_revision=1,
            phase="p1",
            operations=[op("ok:1"), op("bad:1", password="correct horse battery")],
        )
    assert task_row(agent.engine, "t1") == before and n_ops(agent.engine) == 0


def test_advance_stages_operations_in_the_callers_transaction(agent: Agent) -> None:
    url = url_of(agent.engine)
    with agent.begin() as conn:
        agent.advance(conn, "t1", tenant_id=T, expected_revision=0)
    with agent.begin() as conn:
        task = agent.advance(
            conn,
            "t1",
            tenant_id=T,
            expected_revision=1,
            phase="tickets",
            operations=[op("ticket:create:1"), op("ticket:create:2")],
        )
        assert [o.operation_id for o in task.operations] == ["ticket:create:1", "ticket:create:2"]
        for staged in task.operations:
            assert staged.status is OperationStatus.PENDING
            assert staged.idempotency_key == default_idempotency_key(T, staged.operation_id)
            assert staged.payload_digest == payload_digest(staged.payload)
        # Not visible to anybody else before the agent commits...
        assert count(url, "SELECT count(*) FROM outbox_operations") == 0
        assert peek(url, "SELECT state_revision FROM outbox_tasks") == [(1,)]
    # ...and both together after.
    assert count(url, "SELECT count(*) FROM outbox_operations") == 2
    assert peek(url, "SELECT state_revision, phase FROM outbox_tasks") == [(2, "tickets")]
    with agent.connect() as conn:
        loaded = agent.load_task(conn, tenant_id=T, task_id="t1")
    assert [o.operation_id for o in loaded.operations] == ["ticket:create:1", "ticket:create:2"]


def test_api_works_with_an_orm_session(agent: Agent) -> None:
    with agent.session() as session:
        agent.advance(session, "t1", tenant_id=T, expected_revision=0, operations=[op("s:1")])
    with agent.session() as session:
        assert agent.get_operation(session, tenant_id=T, operation_id="s:1").task_id == "t1"


# --------------------------------------------------------------------- idempotent enqueue


def test_enqueue_is_idempotent_across_key_order(agent: Agent) -> None:
    first_payload = {"customer": {"id": 42, "tier": "gold"}, "amount": 1250, "lines": [1, 2]}
    second_payload = {"lines": [1, 2], "amount": 1250, "customer": {"tier": "gold", "id": 42}}
    with agent.begin() as conn:
        first = agent.enqueue(
            conn,
            tenant_id=T,
            task_id="t1",
            operation_id="refund:1",
            provider="payments",
            payload=first_payload,
        )
    with agent.begin() as conn:
        again = agent.enqueue(
            conn,
            tenant_id=T,
            task_id="t1",
            operation_id="refund:1",
            provider="payments",
            payload=second_payload,
        )
    assert again.id == first.id
    assert again.payload_digest == first.payload_digest == payload_digest(first_payload)
    assert again.idempotency_key == first.idempotency_key == f"{T}:refund:1"
    assert n_ops(agent.engine) == 1


@pytest.mark.parametrize(
    "change",
    [
        {"payload": {"amount": 1251}},
        {"provider": "other"},
        {"task_id": "t2"},
        {"idempotency_key": "another-key"},
    ],
    ids=["payload", "provider", "task", "key"],
)
def test_enqueue_with_a_different_operation_under_the_same_id_is_refused(
    agent: Agent, change: dict[str, Any]
) -> None:
    base: dict[str, Any] = {
        "tenant_id": T,
        "task_id": "t1",
        "operation_id": "refund:1",
        "provider": "payments",
        "payload": {"amount": 1250},
    }
    with agent.begin() as conn:
        first = agent.enqueue(conn, **base)
    with agent.begin() as conn, pytest.raises(errors.PayloadMismatch):
        agent.enqueue(conn, **{**base, **change})
    with agent.connect() as conn:
        kept = agent.get_operation(conn, tenant_id=T, operation_id="refund:1")
    assert kept == first  # the accepted payload is never replaced


def test_payload_mismatch_inside_advance_writes_nothing(agent: Agent) -> None:
    with agent.begin() as conn:
        agent.advance(conn, "t1", tenant_id=T, expected_revision=0, operations=[op("a", v=1)])
    before = task_row(agent.engine, "t1")
    with agent.begin() as conn, pytest.raises(errors.PayloadMismatch):
        agent.advance(
            conn, "t1", tenant_id=T, expected_revision=1, operations=[op("b"), op("a", v=2)]
        )
    assert task_row(agent.engine, "t1") == before and n_ops(agent.engine) == 1


def test_explicit_key_reused_by_another_operation_is_our_error(agent: Agent) -> None:
    with agent.begin() as conn:
        agent.enqueue(
            conn,
            tenant_id=T,
            task_id="t1",
            operation_id="op-1",
            provider="tickets",
            payload={"n": 1},
            idempotency_key="order-77",
        )
    with agent.begin() as conn, pytest.raises(errors.DuplicateIdempotencyKey) as caught:
        agent.enqueue(
            conn,
            tenant_id=T,
            task_id="t1",
            operation_id="op-2",
            provider="tickets",
            payload={"n": 2},
            idempotency_key="order-77",
        )
    assert caught.value.operation_id == "op-2"  # type: ignore[attr-defined]
    # Another provider (or another tenant) may use the same key.
    with agent.begin() as conn:
        agent.enqueue(
            conn,
            tenant_id=T,
            task_id="t1",
            operation_id="op-3",
            provider="mail",
            payload={"n": 3},
            idempotency_key="order-77",
        )
        agent.enqueue(
            conn,
            tenant_id="tenant-b",
            task_id="t1",
            operation_id="op-2",
            provider="tickets",
            payload={"n": 2},
            idempotency_key="order-77",
        )
    assert n_ops(agent.engine) == 3


def test_explicit_key_equal_to_another_operations_default_key(agent: Agent) -> None:
    with agent.begin() as conn:
        agent.enqueue(
            conn,
            tenant_id=T,
            task_id="t1",
            operation_id="op-1",
            provider="tickets",
            payload={"n": 1},
        )
    with agent.begin() as conn, pytest.raises(errors.DuplicateIdempotencyKey):
        agent.enqueue(
            conn,
            tenant_id=T,
            task_id="t1",
            operation_id="op-2",
            provider="tickets",
            payload={"n": 2},
            idempotency_key=f"{T}:op-1",
        )


def test_default_key_equal_to_another_operations_explicit_key(agent: Agent) -> None:
    """The derived key of a new operation collides with a key given earlier."""
    with agent.begin() as conn:
        agent.enqueue(
            conn,
            tenant_id=T,
            task_id="t1",
            operation_id="op-1",
            provider="tickets",
            payload={"n": 1},
            idempotency_key=f"{T}:op-2",
        )
    with agent.begin() as conn, pytest.raises(errors.DuplicateIdempotencyKey):
        agent.enqueue(
            conn,
            tenant_id=T,
            task_id="t1",
            operation_id="op-2",
            provider="tickets",
            payload={"n": 2},
        )
    assert n_ops(agent.engine) == 1


def test_reenqueue_without_key_returns_an_operation_staged_with_one(agent: Agent) -> None:
    with agent.begin() as conn:
        first = agent.enqueue(
            conn,
            tenant_id=T,
            task_id="t1",
            operation_id="op-1",
            provider="tickets",
            payload={"n": 1},
            idempotency_key="k-1",
        )
    with agent.begin() as conn:
        again = agent.enqueue(
            conn,
            tenant_id=T,
            task_id="t1",
            operation_id="op-1",
            provider="tickets",
            payload={"n": 1},
        )
    assert again.id == first.id and again.idempotency_key == "k-1"


# --------------------------------------------------------------------- refusals


def test_secret_is_refused_at_enqueue_naming_the_path_not_the_value(agent: Agent) -> None:
    secret = "hunter2-but-much-longer-Zq8"
    with agent.begin() as conn, pytest.raises(errors.SecretInPayload) as caught:
        agent.enqueue(
            conn,
            tenant_id=T,
            task_id="t1",
            operation_id="login:1",
            provider="crm",
            payload={"customer": {"name": "Ada", "password": secret}},
        )
    err = caught.value
    assert err.path == "$.customer.password"  # type: ignore[attr-defined]
    for text in (str(err), repr(err), repr(err.fields)):
        assert secret not in text
    assert n_ops(agent.engine) == 0


def test_non_json_object_payload_is_refused(agent: Agent) -> None:
    bad: list[Any] = [["not", "an", "object"], "text", 3, {"x": float("nan")}, {"x": object()}]
    for payload in bad:
        with agent.begin() as conn, pytest.raises(errors.InvalidPayload):
            agent.enqueue(
                conn, tenant_id=T, task_id="t1", operation_id="x", provider="p", payload=payload
            )
    assert n_ops(agent.engine) == 0


def test_payload_or_ref_required(agent: Agent) -> None:
    with agent.begin() as conn, pytest.raises(errors.InvalidPayload):
        agent.enqueue(conn, tenant_id=T, task_id="t1", operation_id="x", provider="p")
    with agent.begin() as conn, pytest.raises(errors.InvalidPayload):
        agent.enqueue(
            conn,
            tenant_id=T,
            task_id="t1",
            operation_id="x",
            provider="p",
            payload_ref="s3://bucket/x",
        )
    digest = "sha256:" + "ab" * 32
    with agent.begin() as conn:
        rec = agent.enqueue(
            conn,
            tenant_id=T,
            task_id="t1",
            operation_id="x",
            provider="p",
            payload_ref="s3://bucket/x",
            payload_digest=digest,
        )
    assert (rec.payload, rec.payload_ref, rec.payload_digest) == (None, "s3://bucket/x", digest)


def test_identity_fields_must_be_non_empty(agent: Agent) -> None:
    for field in ("tenant_id", "task_id", "operation_id", "provider"):
        args: dict[str, Any] = {
            "tenant_id": T,
            "task_id": "t1",
            "operation_id": "x",
            "provider": "p",
            "payload": {"a": 1},
            field: "  ",
        }
        with agent.begin() as conn, pytest.raises(errors.InvalidPayload) as caught:
            agent.enqueue(conn, **args)
        assert caught.value.field == field  # type: ignore[attr-defined]
    assert n_ops(agent.engine) == 0


# --------------------------------------------------------------------- constraints


def _raw_insert(conn: Connection, operation_id: str, tenant_id: str = T, **extra: Any) -> None:
    values = {
        "tenant_id": tenant_id,
        "task_id": "t1",
        "operation_id": operation_id,
        "provider": "p",
        "payload": '{"a": 1}',
        **extra,
    }
    cols = ", ".join(values)
    params = ", ".join(f":{k}" for k in values)
    conn.execute(sa.text(f"INSERT INTO outbox_operations ({cols}) VALUES ({params})"), values)


def test_unique_tenant_and_operation_id(engine: Engine) -> None:
    with engine.begin() as conn:
        _raw_insert(conn, "dup")
        _raw_insert(conn, "dup", tenant_id="tenant-b")  # another tenant: fine
    with pytest.raises(sa.exc.IntegrityError), engine.begin() as conn:
        _raw_insert(conn, "dup", idempotency_key="other")
    assert n_ops(engine) == 2


def test_status_check_refuses_an_unknown_status(engine: Engine) -> None:
    with pytest.raises(sa.exc.IntegrityError, match="status_valid"), engine.begin() as conn:
        _raw_insert(conn, "bad-status", status="sent")
    with engine.begin() as conn:
        _raw_insert(conn, "ok")
    with pytest.raises(sa.exc.IntegrityError, match="status_valid"), engine.begin() as conn:
        conn.execute(sa.text("UPDATE outbox_operations SET status = 'done'"))
    with engine.begin() as conn:  # every enum value passes the constraint
        for i, status in enumerate(OperationStatus):
            _raw_insert(
                conn,
                f"s{i}",
                status=status.value,
                fencing_token=i,
                lease_expires_at="2030-01-01 00:00:00.000000",
            )
    assert n_ops(engine) == 1 + len(OperationStatus)


def test_leased_states_need_a_lease_and_a_token(engine: Engine) -> None:
    for status in ("claimed", "dispatching"):
        with pytest.raises(sa.exc.IntegrityError, match="leased_has_lease"), engine.begin() as c:
            _raw_insert(c, f"x-{status}", status=status)


def test_payload_or_ref_check_in_the_database(engine: Engine) -> None:
    with pytest.raises(sa.exc.IntegrityError, match="payload_or_ref"), engine.begin() as conn:
        _raw_insert(conn, "nothing", payload=None)


def test_task_revision_is_unique_per_tenant_and_nonnegative(engine: Engine) -> None:
    with engine.begin() as conn:
        conn.execute(sa.text("INSERT INTO outbox_tasks (tenant_id, task_id) VALUES ('a', 't')"))
    with pytest.raises(sa.exc.IntegrityError), engine.begin() as conn:
        conn.execute(sa.text("INSERT INTO outbox_tasks (tenant_id, task_id) VALUES ('a', 't')"))
    with pytest.raises(sa.exc.IntegrityError, match="revision_nonnegative"), engine.begin() as c:
        c.execute(sa.text("UPDATE outbox_tasks SET state_revision = -1"))


# --------------------------------------------------------------------- cancellation


def _set_status(conn: Connection, operation_id: str, status: str) -> None:
    conn.execute(
        sa.update(ops_t)
        .where(ops_t.c.tenant_id == T, ops_t.c.operation_id == operation_id)
        .values(status=status, fencing_token=11, lease_owner="w1", lease_expires_at=db_now(30))
    )


def test_cancel_task_cancels_pending_and_blocked_and_reports_the_rest(agent: Agent) -> None:
    statuses = ["pending", "blocked", "claimed", "dispatching", "unknown", "applied", "rejected"]
    with agent.begin() as conn:
        agent.advance(
            conn,
            "t1",
            tenant_id=T,
            expected_revision=0,
            operations=[op(f"op-{s}") for s in statuses],
        )
        agent.advance(conn, "t2", tenant_id=T, expected_revision=0, operations=[op("other")])
    with agent.engine.begin() as conn:  # where the dispatcher would have moved them
        for s in statuses[1:]:
            _set_status(conn, f"op-{s}", s)
    with agent.begin() as conn:
        result = agent.cancel_task(
            conn, tenant_id=T, task_id="t1", actor="ops@example", reason="customer withdrew"
        )
    assert sorted(result.cancelled) == ["op-blocked", "op-pending"]
    assert sorted(result.too_late) == ["op-claimed", "op-dispatching", "op-unknown"]

    with agent.connect() as conn:
        task = agent.load_task(conn, tenant_id=T, task_id="t1")
        other = agent.get_operation(conn, tenant_id=T, operation_id="other")
    with agent.engine.connect() as conn:
        events = conn.execute(
            sa.select(
                events_t.c.operation_id,
                events_t.c.kind,
                events_t.c.from_status,
                events_t.c.to_status,
                events_t.c.actor,
            ).order_by(events_t.c.id)
        ).all()
    assert task.cancelled_at is not None and task.cancel_reason == "customer withdrew"
    now = {o.operation_id: o for o in task.operations}
    for s in ("pending", "blocked"):
        cancelled = now[f"op-{s}"]
        assert cancelled.status is OperationStatus.CANCELLED
        assert cancelled.status_reason == "task_cancelled"
        assert cancelled.lease_expires_at is None and cancelled.state_revision == 1
    for s in ("claimed", "dispatching", "unknown", "applied", "rejected"):
        assert now[f"op-{s}"].status == s  # not recalled, not touched
    assert other.status is OperationStatus.PENDING  # another task: untouched
    too_late = {
        (e.operation_id, e.from_status, e.to_status) for e in events if e.kind == "cancel_too_late"
    }
    assert too_late == {(f"op-{s}", s, s) for s in ("claimed", "dispatching", "unknown")}
    moved = {(e.operation_id, e.to_status) for e in events if e.kind == "transition"}
    assert moved == {("op-pending", "cancelled"), ("op-blocked", "cancelled")}
    assert {e.actor for e in events} == {"ops@example"}


def test_cancel_is_repeatable_and_creates_a_missing_task_row(agent: Agent) -> None:
    with agent.begin() as conn:
        agent.enqueue(
            conn,
            tenant_id=T,
            task_id="elsewhere",
            operation_id="op-1",
            provider="p",
            payload={"a": 1},
        )
    with agent.begin() as conn:
        first = agent.cancel_task(conn, tenant_id=T, task_id="elsewhere", actor="agent")
    assert first.cancelled == ("op-1",)
    row = task_row(agent.engine, "elsewhere")
    assert row is not None and row["cancelled_at"] is not None
    with agent.begin() as conn:
        second = agent.cancel_task(conn, tenant_id=T, task_id="elsewhere", actor="agent")
    assert second.cancelled == () and second.too_late == ()
    assert task_row(agent.engine, "elsewhere") == row  # first cancellation time kept


def test_plain_sql_cancellation_is_swept(engine: Engine) -> None:
    with engine.begin() as conn:
        api.advance(conn, "t1", tenant_id=T, expected_revision=0, operations=[op("a"), op("b")])
        _set_status(conn, "b", "dispatching")
    with engine.begin() as conn:
        conn.execute(
            sa.text("UPDATE outbox_tasks SET cancelled_at = :now WHERE task_id = 't1'"),
            {"now": "2030-01-01 00:00:00.000000"},
        )
    with engine.begin() as conn:
        swept = api.sweep_cancelled(conn)
    assert swept.cancelled == ("a",) and swept.too_late == ()
