"""The agent-side API: stage effects inside the caller's own database transaction.

Every function here takes a SQLAlchemy ``Connection`` or ``Session`` that **the caller
owns**. They never begin, commit, roll back or retry: the point of an outbox is that the
agent's checkpoint transition and the operations it implies commit together, or not at
all. If a function raises, the caller's transaction may hold part of the work: roll it
back.

Agents not written in Python write the same rows with plain SQL (see ``docs/plain-sql.md``).

This module is the public entry. It holds the reads (:func:`load_task`,
:func:`list_operations`, :func:`get_operation`) and re-exports the writes from the modules
that hold them: :mod:`outbox.validation` (:class:`StagedOperation`), :mod:`outbox.staging`
(:func:`enqueue`), :mod:`outbox.checkpoints` (:func:`advance`) and
:mod:`outbox.cancellation` (:func:`cancel_task`, :func:`sweep_cancelled`).
"""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.engine import Connection
from sqlalchemy.orm import Session

from outbox import errors, schema
from outbox.cancellation import SYSTEM_ACTOR, CancelResult, cancel_task, sweep_cancelled
from outbox.checkpoints import advance
from outbox.db import connection_of
from outbox.records import OperationRecord, TaskRecord
from outbox.staging import enqueue, existing_operation
from outbox.tenancy import set_tenant
from outbox.validation import StagedOperation

__all__ = [
    "SYSTEM_ACTOR",
    "CancelResult",
    "StagedOperation",
    "advance",
    "cancel_task",
    "enqueue",
    "get_operation",
    "list_operations",
    "load_task",
    "sweep_cancelled",
]

ops_t, tasks_t = schema.operations, schema.tasks


def load_task(conn: Connection | Session, *, tenant_id: str, task_id: str) -> TaskRecord:
    """The task with its operations (in insertion order)."""
    c = connection_of(conn)
    set_tenant(c, tenant_id)
    row = (
        c.execute(
            sa.select(tasks_t).where(tasks_t.c.tenant_id == tenant_id, tasks_t.c.task_id == task_id)
        )
        .mappings()
        .first()
    )
    if row is None:
        raise errors.TaskNotFound(tenant_id=tenant_id, task_id=task_id)
    return TaskRecord.from_row(row, tuple(list_operations(c, tenant_id=tenant_id, task_id=task_id)))


def list_operations(
    conn: Connection | Session, *, tenant_id: str, task_id: str
) -> list[OperationRecord]:
    set_tenant(conn, tenant_id)
    rows = (
        connection_of(conn)
        .execute(
            sa.select(ops_t)
            .where(ops_t.c.tenant_id == tenant_id, ops_t.c.task_id == task_id)
            .order_by(ops_t.c.id)
        )
        .mappings()
    )
    return [OperationRecord.from_row(r) for r in rows]


def get_operation(
    conn: Connection | Session, *, tenant_id: str, operation_id: str
) -> OperationRecord:
    set_tenant(conn, tenant_id)
    found = existing_operation(connection_of(conn), tenant_id, operation_id)
    if found is None:
        raise errors.OperationNotFound(tenant_id=tenant_id, operation_id=operation_id)
    return found
