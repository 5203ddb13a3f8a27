"""The task checkpoint: a compare-and-set of the agent's task row that stages, in the same
transaction, the operations the new checkpoint implies (:func:`advance`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection
from sqlalchemy.orm import Session

from outbox import errors, schema
from outbox.db import connection_of, insert_for
from outbox.ddl import DEFAULT_MAX_PAYLOAD_BYTES
from outbox.protection import envelopes as protect
from outbox.records import TaskRecord
from outbox.staging import existing_operation, same_operation, stage_row
from outbox.tenancy import set_tenant
from outbox.types import db_now
from outbox.validation import StagedOperation, prepare

tasks_t = schema.tasks


def advance(
    conn: Connection | Session,
    task_id: str,
    *,
    tenant_id: str,
    expected_revision: int,
    phase: str | None = None,
    state: Any = None,
    operations: Sequence[StagedOperation] = (),
    workflow_version: str | None = None,
    max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
    protection: protect.Protection | None = None,
) -> TaskRecord:
    """Compare-and-set the task's checkpoint and stage the operations it implies.

    Runs in the caller's transaction (never begins, commits or retries). The task moves
    from ``expected_revision`` to ``expected_revision + 1``; ``expected_revision=0`` creates
    the task. A stale revision raises :class:`~outbox.errors.RevisionConflict` and writes
    nothing; so does an invalid operation (validated before the task is touched).
    ``protection`` as for :func:`enqueue`.
    """
    c = connection_of(conn)
    set_tenant(c, tenant_id)
    prot = protection if protection is not None else protect.default()
    rows = [prepare(tenant_id, task_id, op, max_payload_bytes, prot) for op in operations]
    for row in rows:
        existing = existing_operation(c, tenant_id, row["operation_id"])
        if existing is not None and not same_operation(existing, row):
            raise errors.PayloadMismatch(tenant_id=tenant_id, operation_id=row["operation_id"])
    values: dict[str, Any] = {"phase": phase, "state": state, "updated_at": db_now()}
    if workflow_version is not None:
        values["workflow_version"] = workflow_version
    if expected_revision == 0:
        stmt = (
            insert_for(c)(tasks_t)
            .values(
                tenant_id=tenant_id,
                task_id=task_id,
                state_revision=1,
                phase=phase,
                state=state,
                workflow_version=workflow_version,
            )
            .on_conflict_do_nothing()
            .returning(*tasks_t.c)
        )
    else:
        stmt = (
            sa.update(tasks_t)
            .where(
                tasks_t.c.tenant_id == tenant_id,
                tasks_t.c.task_id == task_id,
                tasks_t.c.state_revision == expected_revision,
            )
            .values(state_revision=tasks_t.c.state_revision + 1, **values)
            .returning(*tasks_t.c)
        )
    task_row = c.execute(stmt).mappings().first()
    if task_row is None and expected_revision == 0:  # a row made by plain SQL or cancel_task
        task_row = (
            c.execute(
                sa.update(tasks_t)
                .where(
                    tasks_t.c.tenant_id == tenant_id,
                    tasks_t.c.task_id == task_id,
                    tasks_t.c.state_revision == 0,
                )
                .values(state_revision=1, **values)
                .returning(*tasks_t.c)
            )
            .mappings()
            .first()
        )
    if task_row is None:
        actual = c.execute(
            sa.select(tasks_t.c.state_revision).where(
                tasks_t.c.tenant_id == tenant_id, tasks_t.c.task_id == task_id
            )
        ).scalar()
        raise errors.RevisionConflict(task_id=task_id, expected=expected_revision, actual=actual)
    staged = tuple(stage_row(c, row) for row in rows)
    return TaskRecord.from_row(task_row, staged)
