"""Staging an operation: idempotent by ``(tenant_id, operation_id)``, never replaced.

:func:`stage_row` inserts a validated row (see :mod:`outbox.validation`) or returns the
operation already staged under that id when it is the same one, and refuses a different
payload under the same id. :func:`enqueue` stages one operation on its own.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection
from sqlalchemy.orm import Session

from outbox import errors, schema
from outbox.db import connection_of, insert_for, mapped_errors
from outbox.ddl import DEFAULT_MAX_PAYLOAD_BYTES
from outbox.digest import default_idempotency_key, payload_digest
from outbox.protection import envelopes as protect
from outbox.records import OperationRecord
from outbox.tenancy import set_tenant
from outbox.validation import StagedOperation, prepare

ops_t = schema.operations


def existing_operation(
    conn: Connection, tenant_id: str, operation_id: str
) -> OperationRecord | None:
    """The operation staged under ``(tenant_id, operation_id)``, if any."""
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


def same_operation(existing: OperationRecord, row: Mapping[str, Any]) -> bool:
    """Is the prepared ``row`` the operation already staged (payload, provider, task, ref, key)?"""
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


def stage_row(conn: Connection, row: dict[str, Any]) -> OperationRecord:
    """Insert a prepared row, or return the same operation already staged under its id."""
    existing = existing_operation(conn, row["tenant_id"], row["operation_id"])
    if existing is not None:
        if not same_operation(existing, row):
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
    stmt = insert_for(conn)(ops_t).values(**values).on_conflict_do_nothing().returning(*ops_t.c)
    with mapped_errors():
        inserted = conn.execute(stmt).mappings().first()
    if inserted is None:
        again = existing_operation(conn, row["tenant_id"], row["operation_id"])
        if again is None:
            raise errors.DuplicateIdempotencyKey(
                tenant_id=row["tenant_id"],
                provider=row["provider"],
                operation_id=row["operation_id"],
            )
        if not same_operation(again, row):
            raise errors.PayloadMismatch(
                tenant_id=row["tenant_id"], operation_id=row["operation_id"]
            )
        return again
    if inserted["idempotency_key"] is None:  # SQLite's trigger fills it after the insert
        return existing_operation(
            conn, row["tenant_id"], row["operation_id"]
        ) or OperationRecord.from_row(inserted)
    return OperationRecord.from_row(inserted)


def enqueue(
    conn: Connection | Session,
    /,
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
    ``protection`` (default: :func:`outbox.protection.envelopes.configure`'s) seals the payload of a
    protected provider (see docs/security.md). ``options`` are the other
    :class:`StagedOperation` fields.
    """
    set_tenant(conn, tenant_id)
    op = StagedOperation(operation_id=operation_id, provider=provider, payload=payload, **options)
    prot = protection if protection is not None else protect.default()
    return stage_row(connection_of(conn), prepare(tenant_id, task_id, op, max_payload_bytes, prot))
