"""Cancelling a task: its operations not yet sent become ``cancelled``; those that may
already have been dispatched are reconciled, not recalled (:func:`cancel_task`, and
:func:`sweep_cancelled` for tasks cancelled by plain SQL)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection
from sqlalchemy.orm import Session

from outbox import schema
from outbox.db import connection_of, insert_for
from outbox.states import MAYBE_APPLIED, NON_TERMINAL, OperationStatus, checked_move
from outbox.tenancy import set_tenant
from outbox.types import db_now

ops_t, tasks_t, events_t = schema.operations, schema.tasks, schema.events
SYSTEM_ACTOR = "outbox"


@dataclass(frozen=True)
class CancelResult:
    cancelled: tuple[str, ...]
    too_late: tuple[str, ...]
    """Operations that may already have been dispatched: they are reconciled, not recalled."""


def cancel_task(
    conn: Connection | Session,
    *,
    tenant_id: str,
    task_id: str,
    actor: str,
    reason: str | None = None,
) -> CancelResult:
    """Cancel a task in the caller's transaction (never begins, commits or retries).

    Its ``pending`` and ``blocked`` operations become ``cancelled``. Those already
    ``claimed``, ``dispatching`` or ``unknown`` cannot be recalled: each gets a
    ``cancel_too_late`` event and is reconciled as usual. Creates the task row if the
    agent kept its checkpoint elsewhere, so the cancellation survives restarts.
    """
    c = connection_of(conn)
    set_tenant(c, tenant_id)
    updated = c.execute(
        sa.update(tasks_t)
        .where(
            tasks_t.c.tenant_id == tenant_id,
            tasks_t.c.task_id == task_id,
            tasks_t.c.cancelled_at.is_(None),
        )
        .values(cancelled_at=db_now(), cancel_reason=reason, updated_at=db_now())
    )
    if updated.rowcount == 0:
        c.execute(
            insert_for(c)(tasks_t)
            .values(
                tenant_id=tenant_id, task_id=task_id, cancelled_at=db_now(), cancel_reason=reason
            )
            .on_conflict_do_nothing()
        )
    return sweep_cancelled(c, tenant_id=tenant_id, task_id=task_id, actor=actor, reason=reason)


def sweep_cancelled(
    conn: Connection,
    *,
    tenant_id: str | None = None,
    task_id: str | None = None,
    actor: str = SYSTEM_ACTOR,
    reason: str | None = None,
) -> CancelResult:
    """Apply task cancellations to their operations (also for tasks cancelled by plain SQL)."""
    cancelled_tasks = sa.select(tasks_t.c.tenant_id, tasks_t.c.task_id).where(
        tasks_t.c.cancelled_at.isnot(None)
    )
    if tenant_id is not None:
        cancelled_tasks = cancelled_tasks.where(tasks_t.c.tenant_id == tenant_id)
    if task_id is not None:
        cancelled_tasks = cancelled_tasks.where(tasks_t.c.task_id == task_id)
    match = sa.tuple_(ops_t.c.tenant_id, ops_t.c.task_id).in_(cancelled_tasks)
    maybe_applied = ops_t.c.last_outcome.in_(sorted(MAYBE_APPLIED))
    # A pending row whose earlier attempt may have landed is not "never sent": it cannot be
    # recalled, so it is reconciled (unknown) instead; not found -> cancelled on a later sweep.
    uncertain = conn.execute(
        sa.update(ops_t)
        .where(match, ops_t.c.status == OperationStatus.PENDING.value, maybe_applied)
        .values(
            status=checked_move(OperationStatus.PENDING, OperationStatus.UNKNOWN),
            status_reason="cancel_too_late",
            state_revision=ops_t.c.state_revision + 1,
            updated_at=db_now(),
        )
        .returning(ops_t.c.tenant_id, ops_t.c.task_id, ops_t.c.operation_id)
    ).all()
    moved = conn.execute(
        sa.update(ops_t)
        .where(
            match,
            ops_t.c.status.in_([OperationStatus.PENDING, OperationStatus.BLOCKED]),
            sa.or_(ops_t.c.last_outcome.is_(None), ~maybe_applied),
        )
        .values(
            status=checked_move((OperationStatus.PENDING, OperationStatus.BLOCKED),
                         OperationStatus.CANCELLED),
            status_reason="task_cancelled",
            state_revision=ops_t.c.state_revision + 1,
            updated_at=db_now(),
            lease_owner=None,
            lease_expires_at=None,
        )
        .returning(ops_t.c.tenant_id, ops_t.c.task_id, ops_t.c.operation_id)
    ).all()
    late_statuses = [
        s.value for s in NON_TERMINAL if s not in (OperationStatus.PENDING, OperationStatus.BLOCKED)
    ]
    late: Sequence[Any] = []
    if task_id is not None:  # explicit cancellation: say which cannot be recalled
        late = conn.execute(
            sa.select(
                ops_t.c.tenant_id, ops_t.c.task_id, ops_t.c.operation_id, ops_t.c.status
            ).where(match, ops_t.c.status.in_(late_statuses))
        ).all()
    rows = (
        [
            {
                "tenant_id": r.tenant_id,
                "task_id": r.task_id,
                "operation_id": r.operation_id,
                "kind": "transition",
                "from_status": None,
                "to_status": "cancelled",
                "actor": actor,
                "reason": reason or "task_cancelled",
            }
            for r in moved
        ]
        + [
            {
                "tenant_id": r.tenant_id,
                "task_id": r.task_id,
                "operation_id": r.operation_id,
                "kind": "cancel_too_late",
                "from_status": r.status,
                "to_status": r.status,
                "actor": actor,
                "reason": "already possibly dispatched: reconciled, not recalled",
            }
            for r in late
            if r.operation_id not in {u.operation_id for u in uncertain}
        ]
        + [
            {
                "tenant_id": r.tenant_id,
                "task_id": r.task_id,
                "operation_id": r.operation_id,
                "kind": "cancel_too_late",
                "from_status": "pending",
                "to_status": "unknown",
                "actor": actor,
                "reason": "an earlier attempt may have landed: reconciled, not recalled",
            }
            for r in uncertain
        ]
    )
    if rows:
        conn.execute(sa.insert(events_t), rows)
    too_late = {r.operation_id for r in late} | {r.operation_id for r in uncertain}
    return CancelResult(tuple(r.operation_id for r in moved), tuple(sorted(too_late)))
