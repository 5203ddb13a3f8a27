"""The agent-side API: stage effects inside the caller's own database transaction.

Every function here takes a SQLAlchemy ``Connection`` or ``Session`` that **the caller
owns**. They never begin, commit, roll back or retry: the point of an outbox is that the
agent's checkpoint transition and the operations it implies commit together, or not at
all. If a function raises, the caller's transaction may hold part of the work: roll it
back.

Agents not written in Python write the same rows with plain SQL (see ``docs/plain-sql.md``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Connection
from sqlalchemy.orm import Session

from outbox import errors, protect, schema
from outbox.db import mapped_errors
from outbox.ddl import DEFAULT_MAX_PAYLOAD_BYTES
from outbox.digest import canonical_json, default_idempotency_key, payload_digest
from outbox.records import OperationRecord, TaskRecord
from outbox.secrets import check_no_secrets
from outbox.states import MAYBE_APPLIED, NON_TERMINAL, OperationStatus
from outbox.tenancy import set_tenant
from outbox.types import db_now

ops_t, tasks_t, events_t = schema.operations, schema.tasks, schema.events
SYSTEM_ACTOR = "outbox"


@dataclass(frozen=True)
class StagedOperation:
    """An operation to stage with :func:`advance` (the same fields as :func:`enqueue`)."""

    operation_id: str
    provider: str
    payload: Mapping[str, Any] | None = None
    payload_ref: str | None = None
    payload_digest: str | None = None
    idempotency_key: str | None = None
    requires_approval: bool = False
    deadline_at: datetime | None = None
    ordering_key: str | None = None
    max_attempts: int | None = None
    max_elapsed_seconds: float | None = None
    workflow_version: str | None = None
    payload_schema: int | None = None
    traceparent: str | None = None


def _conn(c: Connection | Session) -> Connection:
    return c.connection() if isinstance(c, Session) else c


def _insert(conn: Connection) -> Any:
    dialect = postgresql if conn.dialect.name == "postgresql" else sqlite
    return dialect.insert


_MAX_SAFE_INTEGER = 2**53 - 1


def _unportable(value: Any, path: str = "$") -> str | None:
    """The JSON path of the first value that does not survive a round trip through both
    dialects, else None: a NUL character (PostgreSQL's jsonb refuses it), or an integral
    float beyond 2**53 (jsonb returns it as an integer, which RFC 8785 cannot digest, so
    the row read back could never be admitted)."""
    if isinstance(value, str):
        return path if "\x00" in value else None
    if isinstance(value, float):
        return path if value.is_integer() and abs(value) > _MAX_SAFE_INTEGER else None
    if isinstance(value, Mapping):
        for key, item in value.items():
            sub = f"{path}.{key}"
            if isinstance(key, str) and "\x00" in key:
                return sub
            found = _unportable(item, sub)
            if found is not None:
                return found
    elif isinstance(value, list | tuple):
        for i, item in enumerate(value):
            found = _unportable(item, f"{path}[{i}]")
            if found is not None:
                return found
    return None


def _prepare(
    tenant_id: str,
    task_id: str,
    op: StagedOperation,
    max_payload_bytes: int,
    protection: protect.Protection | None = None,
) -> dict[str, Any]:
    """Validate an operation before anything is written; returns the row to insert (the
    payload sealed in an envelope when ``protection`` covers the provider; the digest is
    always the plaintext's)."""
    for name, value in (
        ("tenant_id", tenant_id),
        ("task_id", task_id),
        ("operation_id", op.operation_id),
        ("provider", op.provider),
    ):
        if not isinstance(value, str) or not value.strip():
            raise errors.InvalidPayload(f"{name} must be a non-empty string", field=name)
    digest = op.payload_digest
    if op.payload is None:
        if op.payload_ref is None:
            raise errors.InvalidPayload("give payload or payload_ref", operation_id=op.operation_id)
        if digest is None:
            raise errors.InvalidPayload(
                "payload_ref needs payload_digest", operation_id=op.operation_id
            )
    else:
        if not isinstance(op.payload, Mapping):
            raise errors.InvalidPayload(
                "the payload must be a JSON object", operation_id=op.operation_id
            )
        if protect.ENVELOPE_KEY in op.payload:
            raise errors.InvalidPayload(
                f"the top-level key {protect.ENVELOPE_KEY!r} is reserved for envelopes",
                operation_id=op.operation_id,
            )
        try:
            size = len(canonical_json(dict(op.payload)))
        except Exception as exc:  # rfc8785 raises on NaN, non-str keys, odd types
            raise errors.InvalidPayload(
                "the payload is not JSON-serialisable", operation_id=op.operation_id
            ) from exc
        if size > max_payload_bytes:
            raise errors.InvalidPayload(
                "the payload exceeds max_payload_bytes",
                operation_id=op.operation_id,
                size=size,
                limit=max_payload_bytes,
            )
        unportable = _unportable(op.payload)
        if unportable is not None:
            raise errors.InvalidPayload(
                "the payload holds a value the database cannot store and return unchanged",
                operation_id=op.operation_id,
                path=unportable,
            )
        check_no_secrets(op.payload)
        computed = payload_digest(dict(op.payload))
        if digest is not None and digest != computed:
            raise errors.InvalidPayload(
                "payload_digest does not match the payload", operation_id=op.operation_id
            )
        digest = computed
    stored: Any = dict(op.payload) if op.payload is not None else None
    if stored is not None and protection is not None and protection.protects(op.provider):
        stored = protection.seal_payload(tenant_id, op.operation_id, stored)
        if len(canonical_json(stored)) > max_payload_bytes:
            raise errors.InvalidPayload(
                "the encrypted payload exceeds max_payload_bytes",
                operation_id=op.operation_id,
                limit=max_payload_bytes,
            )
    row = {
        "tenant_id": tenant_id,
        "task_id": task_id,
        "operation_id": op.operation_id,
        "provider": op.provider,
        "payload": stored,
        "payload_ref": op.payload_ref,
        "payload_digest": digest,
        "requires_approval": op.requires_approval,
        "deadline_at": op.deadline_at,
        "ordering_key": op.ordering_key,
        "max_attempts": op.max_attempts,
        "max_elapsed_seconds": op.max_elapsed_seconds,
        "workflow_version": op.workflow_version,
        "payload_schema": op.payload_schema,
        "traceparent": op.traceparent,
    }
    if op.idempotency_key is not None:
        row["idempotency_key"] = op.idempotency_key
    return row


def _existing(conn: Connection, tenant_id: str, operation_id: str) -> OperationRecord | None:
    row = (
        conn.execute(
            sa.select(ops_t).where(
                ops_t.c.tenant_id == tenant_id, ops_t.c.operation_id == operation_id
            )
        )
        .mappings()
        .first()
    )
    return OperationRecord.from_row(row) if row else None


def _same(existing: OperationRecord, row: Mapping[str, Any]) -> bool:
    digest = existing.payload_digest
    if digest is None and existing.payload is not None:
        digest = payload_digest(existing.payload)
    return bool(
        digest == row["payload_digest"]
        and existing.provider == row["provider"]
        and existing.task_id == row["task_id"]
        and existing.payload_ref == row["payload_ref"]
        and ("idempotency_key" not in row or row["idempotency_key"] == existing.idempotency_key)
    )


def _stage(conn: Connection, row: dict[str, Any]) -> OperationRecord:
    existing = _existing(conn, row["tenant_id"], row["operation_id"])
    if existing is not None:
        if not _same(existing, row):
            raise errors.PayloadMismatch(
                tenant_id=row["tenant_id"], operation_id=row["operation_id"]
            )
        return existing
    # Derive the default key here too (the same value the database trigger derives), so a
    # collision with another operation's key is caught by ON CONFLICT DO NOTHING on both
    # dialects. SQLite's trigger sets it in an AFTER INSERT UPDATE, outside the upsert's
    # conflict handling, which raised a raw IntegrityError instead.
    values = {**row}
    if values.get("idempotency_key") is None:
        values["idempotency_key"] = default_idempotency_key(row["tenant_id"], row["operation_id"])
    stmt = _insert(conn)(ops_t).values(**values).on_conflict_do_nothing().returning(*ops_t.c)
    with mapped_errors():
        inserted = conn.execute(stmt).mappings().first()
    if inserted is None:
        again = _existing(conn, row["tenant_id"], row["operation_id"])
        if again is None:
            raise errors.DuplicateIdempotencyKey(
                tenant_id=row["tenant_id"],
                provider=row["provider"],
                operation_id=row["operation_id"],
            )
        if not _same(again, row):
            raise errors.PayloadMismatch(
                tenant_id=row["tenant_id"], operation_id=row["operation_id"]
            )
        return again
    if inserted["idempotency_key"] is None:  # SQLite's trigger fills it after the insert
        return _existing(conn, row["tenant_id"], row["operation_id"]) or OperationRecord.from_row(
            inserted
        )
    return OperationRecord.from_row(inserted)


def enqueue(
    conn: Connection | Session,
    *,
    tenant_id: str,
    task_id: str,
    operation_id: str,
    provider: str,
    payload: Mapping[str, Any] | None = None,
    max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
    protection: protect.Protection | None = None,
    **options: Any,
) -> OperationRecord:
    """Stage one operation in the caller's transaction (never begins, commits or retries).

    Idempotent by ``(tenant_id, operation_id)``: the same payload again returns the
    existing operation; a different payload under the same id raises
    :class:`~outbox.errors.PayloadMismatch` — a regenerated payload never replaces the
    accepted one. Refuses payloads that are not JSON objects, too large, or carry a
    credential (:class:`~outbox.errors.SecretInPayload`, naming the path, not the value).
    ``protection`` (default: :func:`outbox.protect.configure`'s) seals the payload of a
    protected provider (see docs/security.md). ``options`` are the other
    :class:`StagedOperation` fields.
    """
    set_tenant(conn, tenant_id)
    op = StagedOperation(operation_id=operation_id, provider=provider, payload=payload, **options)
    prot = protection if protection is not None else protect.default()
    return _stage(_conn(conn), _prepare(tenant_id, task_id, op, max_payload_bytes, prot))


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
    c = _conn(conn)
    set_tenant(c, tenant_id)
    prot = protection if protection is not None else protect.default()
    rows = [_prepare(tenant_id, task_id, op, max_payload_bytes, prot) for op in operations]
    for row in rows:
        existing = _existing(c, tenant_id, row["operation_id"])
        if existing is not None and not _same(existing, row):
            raise errors.PayloadMismatch(tenant_id=tenant_id, operation_id=row["operation_id"])
    values: dict[str, Any] = {"phase": phase, "state": state, "updated_at": db_now()}
    if workflow_version is not None:
        values["workflow_version"] = workflow_version
    if expected_revision == 0:
        stmt = (
            _insert(c)(tasks_t)
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
    staged = tuple(_stage(c, row) for row in rows)
    return TaskRecord.from_row(task_row, staged)


def load_task(conn: Connection | Session, *, tenant_id: str, task_id: str) -> TaskRecord:
    """The task with its operations (in insertion order)."""
    c = _conn(conn)
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
        _conn(conn)
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
    found = _existing(_conn(conn), tenant_id, operation_id)
    if found is None:
        raise errors.OperationNotFound(tenant_id=tenant_id, operation_id=operation_id)
    return found


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
    c = _conn(conn)
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
            _insert(c)(tasks_t)
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
            status=OperationStatus.UNKNOWN.value,
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
            status=OperationStatus.CANCELLED.value,
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
