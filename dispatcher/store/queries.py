"""Every hot-path statement of the dispatcher, in one place.

Each function is one named, documented statement (or the smallest group a dialect needs)
with the invariant it keeps. They compile for PostgreSQL and SQLite from the same Core
expressions; times are on the database clock (:class:`outbox.types.db_now`).

Fencing: one claim takes one fresh value of the fencing counter for the whole batch, so
every later write of that batch is ``WHERE (id, state_revision) IN (...) AND
fencing_token = :token AND status = :expected``. A write that matches no row is a
fencing rejection: another worker (or lease recovery) moved the row on.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from dispatcher.store import journal, pg_batch
from dispatcher.store.transitions import Dispatching, Recorded, Transition
from outbox import schema
from outbox.records import OperationRecord, raw_operation_columns
from outbox.states import NON_TERMINAL, OperationStatus, checked_move
from outbox.types import JSONType, db_now, is_due

ops = schema.operations
tasks = schema.tasks
S = OperationStatus
_NON_TERMINAL = sorted(s.value for s in NON_TERMINAL)


def fetch_db_now(conn: Connection) -> datetime:
    """The database clock."""
    value = conn.execute(sa.select(db_now())).scalar_one()
    assert isinstance(value, datetime)
    return value


def next_fencing_token(conn: Connection) -> int:
    """A fresh value of the monotonic fencing counter (sequence / counter row)."""
    if conn.dialect.name == "postgresql":
        return int(conn.execute(sa.select(pg_batch.fencing_token())).scalar_one())
    meta = schema.meta
    value = conn.execute(
        sa.update(meta)
        .where(meta.c.tenant_id == "*", meta.c.name == "fencing")
        .values(value=sa.cast(sa.cast(meta.c.value, sa.Integer) + 1, sa.Text))
        .returning(meta.c.value)
    ).scalar_one()
    return int(value)


def _eligible(limit: int | Any) -> sa.Select[Any]:
    """Pending rows that are due, whose task is not cancelled, and that are first in line
    for their ordering key (no earlier non-terminal operation with the same key)."""
    earlier = ops.alias("earlier")
    cancelled = sa.exists().where(
        tasks.c.tenant_id == ops.c.tenant_id,
        tasks.c.task_id == ops.c.task_id,
        tasks.c.cancelled_at.isnot(None),
    )
    blocked_by_order = sa.exists().where(
        earlier.c.ordering_key == ops.c.ordering_key,
        earlier.c.id < ops.c.id,
        earlier.c.status.in_([pg_batch.status_literal(S(v)) for v in _NON_TERMINAL]),
    )
    return (
        sa.select(ops.c.id)
        .where(
            ops.c.status == pg_batch.status_literal(S.PENDING),
            is_due(ops.c.next_attempt_at),
            ~cancelled,
            sa.or_(ops.c.ordering_key.is_(None), ~blocked_by_order),
        )
        .order_by(ops.c.id)
        .limit(limit)
    )


@functools.cache
def _pg_eligible(limit: int) -> sa.Select[Any]:
    # the limit is rendered, not bound: with ``LIMIT $n`` the planner's generic plan
    # guesses a tenth of the table and it re-plans on every execution instead
    return _eligible(sa.literal_column(str(int(limit)))).with_for_update(skip_locked=True, of=ops)


@functools.cache
def _may_dispatch() -> Any:
    return sa.and_(
        sa.or_(ops.c.deadline_at.is_(None), ops.c.deadline_at > db_now()),
        ~_task_deadline_passed(),
        ~_task_cancelled(),
    )


def _task_deadline_passed() -> Any:
    return sa.exists().where(
        tasks.c.tenant_id == ops.c.tenant_id,
        tasks.c.task_id == ops.c.task_id,
        tasks.c.deadline_at.isnot(None),
        tasks.c.deadline_at <= db_now(),
    )


def _task_cancelled() -> Any:
    return sa.exists().where(
        tasks.c.tenant_id == ops.c.tenant_id,
        tasks.c.task_id == ops.c.task_id,
        tasks.c.cancelled_at.isnot(None),
    )


def operation_claim_batch(
    conn: Connection, *, worker: str, limit: int, lease_seconds: float
) -> tuple[int, list[OperationRecord]]:
    """Claim up to ``limit`` eligible rows: ``pending -> claimed`` with a lease on the
    database clock and a fresh fencing token, and their ``outbox_events`` rows. PostgreSQL:
    one statement (:func:`dispatcher.store.pg_batch.claim`), ``FOR UPDATE SKIP LOCKED`` so
    replicas never wait on each other; SQLite: the caller's ``BEGIN IMMEDIATE`` makes this
    the only writer. Returns ``(token, rows)``."""
    if _pg(conn):
        rows = (
            conn.execute(
                pg_batch.claim(_pg_eligible(limit)),
                {"actor": worker, "lease": lease_seconds},
            )
            .all()
        )
    else:
        rows = (
            conn.execute(
                sa.update(ops)
                .where(ops.c.id.in_(_eligible(limit).scalar_subquery()))
                .values(
                    status=checked_move(S.PENDING, S.CLAIMED),
                    fencing_token=next_fencing_token(conn),
                    lease_owner=worker,
                    lease_expires_at=db_now(lease_seconds),
                    state_revision=ops.c.state_revision + 1,
                    updated_at=db_now(),
                )
                .returning(*raw_operation_columns(ops, raw_times=True))
            )
            .all()
        )
    records = sorted((OperationRecord.from_raw_values(r) for r in rows), key=lambda r: r.id)
    if records and not _pg(conn):
        journal.transitions_from_rows(
            conn, [r.id for r in records], from_status="pending", to_status="claimed", actor=worker
        )
    token = records[0].fencing_token if records else 0
    return int(token or 0), records


def _pg(conn: Connection) -> bool:
    return conn.dialect.name == "postgresql"


def _fenced(token: int, pairs: Iterable[tuple[int, int]], status: OperationStatus) -> Any:
    return sa.and_(
        sa.tuple_(ops.c.id, ops.c.state_revision).in_(list(pairs)),
        ops.c.fencing_token == token,
        ops.c.status == status.value,
    )


def operation_mark_dispatching(
    conn: Connection,
    *,
    token: int,
    pairs: Sequence[tuple[int, int]],
    lease_seconds: float,
    actor: str,
) -> list[Dispatching]:
    """``claimed -> dispatching`` ("dispatch may have occurred"), committed before any
    request leaves, with the rows' ``outbox_events``. Counts the attempt, sets
    ``first_dispatched_at`` once, renews the lease, and refuses rows whose own or task
    deadline has passed on the database clock, or whose task was cancelled meanwhile (they
    are returned absent: see :func:`refusal_reasons`)."""
    if not pairs:
        return []
    if _pg(conn):
        rows = conn.execute(
            pg_batch.mark_dispatching(_may_dispatch()),
            {
                "marking": pg_batch.batch_json([{"id": i, "rev": r} for i, r in pairs]),
                "token": token,
                "lease": lease_seconds,
                "actor": actor,
            },
        ).all()
        return [Dispatching(r[0], r[1], r[2], r[3], r[4]) for r in rows]
    rows = conn.execute(
        sa.update(ops)
        .where(_fenced(token, pairs, S.CLAIMED), _may_dispatch())
        .values(
            status=checked_move(S.CLAIMED, S.DISPATCHING),
            attempts=ops.c.attempts + 1,
            first_dispatched_at=sa.func.coalesce(ops.c.first_dispatched_at, db_now()),
            last_attempt_started_at=db_now(),
            lease_expires_at=db_now(lease_seconds),
            state_revision=ops.c.state_revision + 1,
            updated_at=db_now(),
        )
        .returning(
            ops.c.id,
            ops.c.state_revision,
            ops.c.attempts,
            ops.c.first_dispatched_at,
            ops.c.last_attempt_started_at,
        )
    ).all()
    journal.transitions_from_rows(
        conn, [r[0] for r in rows], from_status="claimed", to_status="dispatching", actor=actor
    )
    return [Dispatching(r[0], r[1], r[2], r[3], r[4]) for r in rows]


def operation_transition_many(
    conn: Connection, *, token: int, expected: OperationStatus, items: Sequence[Transition]
) -> set[int]:
    """Move leased rows on, each conditional on (id, fencing_token, state_revision, status).
    One executemany plus one read-back of which rows this batch actually moved (the token
    is unique to the batch, so ``revision + 1`` under our token can only be our write).
    Returns the ids moved; the others are fencing rejections."""
    if not items:
        return set()
    b = sa.bindparam
    stmt = (
        sa.update(ops)
        .where(
            ops.c.id == b("b_id"),
            ops.c.state_revision == b("b_rev"),
            ops.c.fencing_token == token,
            ops.c.status == expected.value,
        )
        .values(
            status=b("b_status"),
            status_reason=b("b_reason"),
            receipt=sa.case(
                (b("b_has_receipt", type_=sa.Boolean), b("b_receipt", type_=JSONType)),
                else_=ops.c.receipt,
            ),
            last_outcome=sa.func.coalesce(b("b_outcome", type_=sa.Text), ops.c.last_outcome),
            next_attempt_at=sa.case(
                (sa.cast(b("b_delay"), sa.Float).is_(None), None),
                else_=db_now(sa.cast(b("b_delay"), sa.Float)),
            ),
            # the lease ends with the transition, except while a send is still in flight
            lease_owner=sa.case(
                (b("b_status") == S.DISPATCHING.value, ops.c.lease_owner), else_=None
            ),
            lease_expires_at=sa.case(
                (b("b_status") == S.DISPATCHING.value, ops.c.lease_expires_at), else_=None
            ),
            state_revision=ops.c.state_revision + 1,
            updated_at=db_now(),
        )
    )
    if any(t.payload_digest is not None for t in items):
        # fill the digest of plain-SQL rows once (the immutability trigger allows NULL -> value;
        # naming the column makes it fire, so the common path leaves it out)
        stmt = stmt.values(
            payload_digest=sa.func.coalesce(ops.c.payload_digest, b("b_digest", type_=sa.Text))
        )
    conn.execute(
        stmt,
        [
            {
                "b_id": t.id,
                "b_rev": t.state_revision,
                "b_status": checked_move(expected, t.status),
                "b_reason": t.status_reason,
                "b_has_receipt": t.receipt is not None,
                "b_receipt": t.receipt,
                "b_outcome": t.last_outcome,
                "b_delay": t.delay_seconds,
                "b_digest": t.payload_digest,
            }
            for t in items
        ],
    )
    moved = conn.execute(
        sa.select(ops.c.id).where(
            sa.tuple_(ops.c.id, ops.c.state_revision).in_(
                [(t.id, t.state_revision + 1) for t in items]
            ),
            ops.c.fencing_token == token,
        )
    ).scalars()
    return set(moved)


def operation_record_many(
    conn: Connection, *, token: int, items: Sequence[Recorded], actor: str
) -> set[int]:
    """Record a batch's finished sends: each row ``dispatching ->`` its next status, fenced
    on (id, fencing_token, state_revision, status), plus an ``outbox_events`` row for each
    row moved and an ``outbox_attempts`` row for every attempt (a fenced one's evidence
    says ``fenced``). PostgreSQL: one statement (the values as arrays, the event and
    attempt rows written by data-modifying CTEs over the rows moved); SQLite: an
    executemany and two inserts. Returns the ids moved; the others are fencing rejections."""
    if not items:
        return set()
    if not _pg(conn):
        moved = operation_transition_many(
            conn, token=token, expected=S.DISPATCHING, items=[r.transition for r in items]
        )
        journal.write(
            conn,
            [
                journal.event(
                    r.op,
                    from_status=S.DISPATCHING.value,
                    to_status=r.transition.status.value,
                    reason=r.transition.status_reason,
                    actor=actor,
                    fencing_token=token,
                    detail=r.detail,
                )
                for r in items
                if r.op.id in moved
            ],
            [
                r.attempt
                if r.op.id in moved
                else {**r.attempt, "evidence": {**(r.attempt["evidence"] or {}), **pg_batch.FENCED}}
                for r in items
            ],
        )
        return moved
    rows = [
        {
            "id": t.id,
            "rev": t.state_revision,
            "status": checked_move(S.DISPATCHING, t.status),
            "reason": t.status_reason,
            "receipt": t.receipt,
            "outcome": t.last_outcome,
            "delay": t.delay_seconds,
            "digest": t.payload_digest,
            "detail": r.detail,
            **{f"a_{c}": r.attempt[c] for c, _ in pg_batch.ATTEMPT_COLUMNS},
        }
        for r in items
        for t in (r.transition,)
    ]
    with_digest = any(r.transition.payload_digest is not None for r in items)
    result = conn.execute(
        pg_batch.record(with_digest),
        {"rec": pg_batch.batch_json(rows), "token": token, "actor": actor},
    )
    return set(result.scalars())


def lease_extend(
    conn: Connection, *, token: int, pairs: Sequence[tuple[int, int]], lease_seconds: float
) -> set[int]:
    """Extend the lease of rows still ``dispatching`` under this token (not a transition:
    the revision is unchanged). Returns the ids of the rows extended."""
    if not pairs:
        return set()
    result = conn.execute(
        sa.update(ops)
        .where(_fenced(token, pairs, S.DISPATCHING))
        .values(lease_expires_at=db_now(lease_seconds))
        .returning(ops.c.id)
    )
    return set(result.scalars())


def refusal_reasons(conn: Connection, ids: Sequence[int]) -> dict[int, tuple[OperationStatus, str]]:
    """Why claimed rows were not moved to ``dispatching``: task cancelled, or a deadline
    passed on the database clock. Rows absent from the result lost their lease."""
    if not ids:
        return {}
    rows = conn.execute(
        sa.select(ops.c.id, tasks.c.cancelled_at, ops.c.deadline_at, tasks.c.deadline_at, db_now())
        .select_from(
            ops.outerjoin(
                tasks,
                sa.and_(tasks.c.tenant_id == ops.c.tenant_id, tasks.c.task_id == ops.c.task_id),
            )
        )
        .where(ops.c.id.in_(list(ids)), ops.c.status == S.CLAIMED.value)
    ).all()
    reasons: dict[int, tuple[OperationStatus, str]] = {}
    for op_id, cancelled_at, op_deadline, task_deadline, now in rows:
        if cancelled_at is not None:
            reasons[op_id] = (S.CANCELLED, "task_cancelled")
        elif (op_deadline is not None and op_deadline <= now) or (
            task_deadline is not None and task_deadline <= now
        ):
            reasons[op_id] = (S.BLOCKED, "deadline_passed")
    return reasons
