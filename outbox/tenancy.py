"""Tenancy for the caller's transaction, and the audited way to read a payload body.

On PostgreSQL, migration 0002 turns on row-level security (FORCED) on every outbox table.
The agent and operator roles see and change only rows whose ``tenant_id`` equals the
transaction-local setting ``outbox.tenant_id``; :func:`set_tenant` sets it with
``set_config(..., true)`` (the same as ``SET LOCAL``), so it ends with the transaction and
a pooled connection never carries one tenant's context into the next. The dispatcher and
retention roles are cross-tenant by design. SQLite is single-tenant: these functions do
not change the database there (queries still filter by tenant). See
docs/security-model.md.
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection
from sqlalchemy.orm import Session

from outbox import decoding, errors, schema
from outbox.db import connection_of

SETTING = "outbox.tenant_id"
REVEAL_FUNCTION = "outbox_reveal_payload"
REVEAL_EVENT = "payload_revealed"


def set_tenant(conn: Connection | Session, tenant_id: str) -> None:
    """Scope the caller's current transaction to ``tenant_id`` (PostgreSQL; no-op on SQLite).

    Transaction-local: after COMMIT or ROLLBACK the setting is gone, so the next
    transaction on the same pooled connection sees no tenant's rows until it sets one.
    """
    c = connection_of(conn)
    if c.dialect.name != "postgresql":
        return
    if not isinstance(tenant_id, str) or not tenant_id.strip():
        raise errors.InvalidPayload("tenant_id must be a non-empty string", field="tenant_id")
    c.execute(sa.select(sa.func.set_config(SETTING, tenant_id, True)))


def current_tenant(conn: Connection | Session) -> str | None:
    """The tenant the current transaction is scoped to, or None (always None on SQLite)."""
    c = connection_of(conn)
    if c.dialect.name != "postgresql":
        return None
    value = c.execute(sa.select(sa.func.current_setting(SETTING, True))).scalar()
    return str(value) if value else None


def reveal_payload(
    conn: Connection | Session,
    *,
    tenant_id: str,
    operation_id: str,
    actor: str,
    reason: str,
) -> Any:
    """Read one operation's payload body as an explicit, audited action.

    Appends an ``outbox_events`` row (kind ``payload_revealed``) naming ``actor`` and
    ``reason`` in the caller's transaction: the read and its record commit together. On
    PostgreSQL this goes through the ``SECURITY DEFINER`` function
    ``outbox_reveal_payload``, the only way the operator role (which has no SELECT on
    ``payload``) can read a body; the function also records the database user. A purged
    payload reveals as None.
    """
    if not actor.strip() or not reason.strip():
        raise errors.InvalidPayload("reveal_payload needs an actor and a reason")
    c = connection_of(conn)
    if c.dialect.name == "postgresql":
        set_tenant(c, tenant_id)
        fn = getattr(sa.func, REVEAL_FUNCTION)
        try:
            with c.begin_nested():
                raw = c.execute(  # as text: decoded here, one clear error if it cannot be
                    sa.select(sa.cast(fn(tenant_id, operation_id, actor, reason), sa.Text))
                ).scalar_one()
            return _decoded(raw, operation_id)
        except sa.exc.DBAPIError as exc:
            if "operation not found" in str(exc.orig):
                raise errors.OperationNotFound(
                    tenant_id=tenant_id, operation_id=operation_id
                ) from None
            raise
    ops = schema.operations
    row = c.execute(
        sa.select(sa.cast(ops.c.payload, sa.Text).label("payload"), ops.c.task_id).where(
            ops.c.tenant_id == tenant_id, ops.c.operation_id == operation_id
        )
    ).first()
    if row is None:
        raise errors.OperationNotFound(tenant_id=tenant_id, operation_id=operation_id)
    c.execute(
        sa.insert(schema.events).values(
            tenant_id=tenant_id,
            task_id=row.task_id,
            operation_id=operation_id,
            kind=REVEAL_EVENT,
            actor=actor,
            reason=reason,
        )
    )
    return _decoded(row.payload, operation_id)


def _decoded(raw: str | None, operation_id: str) -> Any:
    value = decoding.decode_json(raw, "payload")
    if isinstance(value, decoding.Undecodable):
        raise errors.PayloadUndecodable(
            f"the stored payload cannot be decoded: {value.why}", operation_id=operation_id
        )
    return value
