"""Statements of the repair paths (not the hot path): lease recovery and reconciliation of
``unknown`` rows. Each is conditional on the revision it read, so a concurrent worker,
reconciler or operator wins and the losing write matches nothing."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from outbox import schema
from outbox.records import OperationRecord, raw_operation_columns
from outbox.states import OperationStatus, checked_move
from outbox.types import db_now

ops = schema.operations
S = OperationStatus
__all__ = ["lease_expired", "lease_recover", "not_found_counts_after",
           "unknown_due", "unknown_look_again", "unknown_resolve"]


def lease_expired(conn: Connection, *, limit: int) -> list[OperationRecord]:
    """Leased rows whose lease has passed on the database clock."""
    q = (
        sa.select(*_columns(conn))
        .where(
            ops.c.status.in_([S.CLAIMED.value, S.DISPATCHING.value]),
            ops.c.lease_expires_at < db_now(),
        )
        .order_by(ops.c.lease_expires_at)
        .limit(limit)
    )
    if conn.dialect.name == "postgresql":
        q = q.with_for_update(skip_locked=True)
    return [OperationRecord.from_raw_values(r) for r in conn.execute(q).all()]


def _columns(conn: Connection) -> list[Any]:
    """Every column, content read as text and decoded per row: one undecodable row never
    fails a recovery or reconciliation pass (:mod:`outbox.decoding`)."""
    return raw_operation_columns(ops, raw_times=conn.dialect.name == "sqlite")


def lease_recover(conn: Connection, rows: Sequence[OperationRecord]) -> list[OperationRecord]:
    """Expired ``claimed`` -> ``pending`` (never sent); expired ``dispatching`` ->
    ``unknown`` (may have been sent: never ``pending``). Conditional on revision and an
    expired lease, so a worker that extended its lease in time keeps it."""
    moved: list[OperationRecord] = []
    for status, target, reason in (
        (S.CLAIMED, S.PENDING, None),
        (S.DISPATCHING, S.UNKNOWN, "lease_expired_while_dispatching"),
    ):
        pairs = [(r.id, r.state_revision) for r in rows if r.status == status]
        if not pairs:
            continue
        values: dict[str, Any] = {
            "status": checked_move(status, target),
            "status_reason": reason,
            "lease_owner": None,
            "lease_expires_at": None,
            "state_revision": ops.c.state_revision + 1,
            "updated_at": db_now(),
        }
        if target == S.UNKNOWN:
            values["last_outcome"] = "lost"
            values["next_attempt_at"] = None
        result = conn.execute(
            sa.update(ops)
            .where(
                sa.tuple_(ops.c.id, ops.c.state_revision).in_(pairs),
                ops.c.status == status.value,
                ops.c.lease_expires_at < db_now(),
            )
            .values(**values)
            .returning(*_columns(conn))
        ).all()
        moved.extend(OperationRecord.from_raw_values(r) for r in result)
    return moved


def unknown_due(conn: Connection, *, limit: int) -> list[OperationRecord]:
    """``unknown`` rows whose next look-up is due."""
    return [
        OperationRecord.from_raw_values(r)
        for r in conn.execute(
            sa.select(*_columns(conn))
            .where(
                ops.c.status == S.UNKNOWN.value,
                sa.or_(ops.c.next_attempt_at.is_(None), ops.c.next_attempt_at <= db_now()),
            )
            .order_by(ops.c.next_attempt_at, ops.c.id)
            .limit(limit)
        ).all()
    ]


def unknown_resolve(
    conn: Connection,
    *,
    row: OperationRecord,
    status: OperationStatus,
    reason: str | None,
    receipt: Any = None,
    last_outcome: str | None = None,
    delay_seconds: float | None = None,
) -> bool:
    """Move an ``unknown`` row on from reconciliation evidence, conditional on the revision
    read (a concurrent reconciler or operator wins; this write then matches nothing)."""
    values: dict[str, Any] = {
        "status": checked_move(S.UNKNOWN, status),
        "status_reason": reason,
        "state_revision": ops.c.state_revision + 1,
        "updated_at": db_now(),
        "next_attempt_at": None if delay_seconds is None else db_now(delay_seconds),
    }
    if receipt is not None:
        values["receipt"] = receipt
    if last_outcome is not None:
        values["last_outcome"] = last_outcome
    result = conn.execute(
        sa.update(ops)
        .where(
            ops.c.id == row.id,
            ops.c.state_revision == row.state_revision,
            ops.c.status == S.UNKNOWN.value,
        )
        .values(**values)
    )
    return bool(result.rowcount)


def unknown_look_again(conn: Connection, *, row: OperationRecord, delay_seconds: float) -> None:
    """Keep a row ``unknown`` and schedule its next look-up (not a transition)."""
    conn.execute(
        sa.update(ops)
        .where(
            ops.c.id == row.id,
            ops.c.state_revision == row.state_revision,
            ops.c.status == S.UNKNOWN.value,
        )
        .values(next_attempt_at=db_now(delay_seconds))
    )


def not_found_counts_after(row: OperationRecord, in_flight: float, settle: float) -> datetime:
    """When a not-found look-up becomes evidence of "not applied" for this row.

    No request of the row leaves once it has stopped being ``dispatching``: its sender
    recorded the outcome after the request returned, or its lease passed first and a sender
    never writes after its lease (``Worker._send``). So the last request left by the moment
    the row became ``unknown`` (``updated_at``: a later look-up that finds nothing does not
    move it) and landed, if at all, within ``in_flight_seconds`` of that. Counting from the
    attempt's start alone would be wrong for a sender paused between its ``dispatching``
    commit and its write: its request can leave long after the attempt started."""
    start = row.last_attempt_started_at or row.first_dispatched_at or row.updated_at
    return max(start, row.updated_at) + timedelta(seconds=in_flight + settle)
