"""Approvals bound to the exact payload of one operation.

:func:`approve` records who allowed which operation, bound to the canonical digest of the
payload as it is *now* (``sha256:`` over RFC 8785 JSON: the row's ``payload_digest``, or
computed from its inline payload; for an artifact, the recorded digest of the artifact).
:func:`revoke` withdraws every live approval of the operation. Both run in the caller's
transaction (they never begin, commit or roll back) and append an ``outbox_events`` row
(kind ``approval`` / ``revocation``, with actor and reason).

The dispatcher (:mod:`dispatcher.engine.authority`) sends an operation with ``requires_approval``
only while one of its approvals *matches* (``payload_hash`` equals the row's digest), is
not revoked and not expired on the database clock; :func:`evaluate` is that rule. The
approval is consumed (``consumed_at``, ``consumed_fencing_token``) in the transaction that
first commits ``dispatching`` and covers the operation's retries; it is re-checked before
every re-send, so an approval that expired or was revoked meanwhile blocks the re-send until
a new one is given.

Choices: approving an operation that does not require approval, or one already finished
(applied, verified, rejected, cancelled), is refused (:class:`~outbox.errors.ApprovalError`):
such an approval would authorise nothing and mislead an audit.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection
from sqlalchemy.orm import Session

from outbox import errors, schema
from outbox.db import connection_of
from outbox.digest import payload_digest
from outbox.records import OperationRecord
from outbox.states import TERMINAL, OperationStatus, checked_move
from outbox.types import db_now

APPROVAL_MISSING = "approval_missing"
APPROVAL_EXPIRED = "approval_expired"
APPROVAL_REVOKED = "approval_revoked"
APPROVAL_MISMATCH = "approval_mismatch"
APPROVAL_REASONS = frozenset({APPROVAL_MISSING, APPROVAL_EXPIRED, APPROVAL_REVOKED,
                              APPROVAL_MISMATCH})

approvals_t, ops_t, events_t = schema.approvals, schema.operations, schema.events


@dataclass(frozen=True)
class Approval:
    id: int
    tenant_id: str
    operation_id: str
    payload_hash: str
    approved_by: str
    reason: str | None
    approved_at: datetime
    expires_at: datetime | None
    revoked_at: datetime | None
    revoked_by: str | None
    consumed_at: datetime | None
    consumed_fencing_token: int | None

    @classmethod
    def from_row(cls, row: Any) -> Approval:
        return cls(**{k: row[k] for k in cls.__dataclass_fields__})

    def valid_at(self, now: datetime) -> bool:
        return self.revoked_at is None and (self.expires_at is None or self.expires_at > now)


@dataclass(frozen=True)
class ApprovalResult:
    approval: Approval
    released: bool
    """The operation was ``blocked`` for an approval reason and is ``pending`` again."""
    status: OperationStatus
    """The operation's status after the approval."""
    status_reason: str | None

    def next_step(self) -> str:
        """What happens next, in words, for the person who approved."""
        if self.released:
            return "released: blocked -> pending; it will be dispatched"
        if self.status == OperationStatus.BLOCKED and self.status_reason in APPROVAL_REASONS:
            return (f"recorded only: the operation stays blocked ({self.status_reason}); "
                    "release it with `outboxd ops requeue`")
        if self.status == OperationStatus.BLOCKED:
            return (f"the operation stays blocked ({self.status_reason}): an approval does "
                    "not release that reason (see docs/runbook.md)")
        return f"the operation is {self.status.value}; the approval is used at its next send"


def _nonempty(name: str, value: str | None) -> str:
    if not isinstance(value, str) or not value.strip():
        raise errors.ApprovalError(f"{name} must be a non-empty string", field=name)
    return value


_BODIES = ("payload", "receipt")


def _operation(conn: Connection, tenant_id: str, operation_id: str) -> OperationRecord:
    """The operation's metadata. Bodies are read only when no digest is stored yet (a row
    written with plain SQL and not yet admitted): approvers on PostgreSQL's operator role
    may read metadata but not payloads, and the stored digest is immutable and verified
    against the payload at admission."""
    where = (ops_t.c.tenant_id == tenant_id, ops_t.c.operation_id == operation_id)
    meta = [c for c in ops_t.c if c.name not in _BODIES]
    row = conn.execute(sa.select(*meta).where(*where)).mappings().first()
    if row is None:
        raise errors.OperationNotFound(tenant_id=tenant_id, operation_id=operation_id)
    data = {**row, "payload": None, "receipt": None}
    if row["payload_digest"] is None:
        data["payload"] = conn.execute(sa.select(ops_t.c.payload).where(*where)).scalar()
    return OperationRecord.from_row(data)


def operation_digest(op: OperationRecord) -> str:
    """The digest an approval of ``op`` binds to (its payload as it is now)."""
    if op.payload is not None:
        try:
            computed = payload_digest(op.payload)
        except Exception as exc:
            raise errors.ApprovalError("the stored payload is not canonical JSON",
                                       operation_id=op.operation_id) from exc
        if op.payload_digest is not None and op.payload_digest != computed:
            raise errors.ApprovalError("the stored payload_digest does not match the payload",
                                       operation_id=op.operation_id)
        return computed
    if not op.payload_digest:
        raise errors.ApprovalError("the operation has neither payload nor payload_digest",
                                   operation_id=op.operation_id)
    return op.payload_digest


def list_approvals(
    conn: Connection | Session, *, tenant_id: str, operation_id: str
) -> list[Approval]:
    """Every approval of the operation, oldest first."""
    rows = connection_of(conn).execute(
        sa.select(approvals_t)
        .where(approvals_t.c.tenant_id == tenant_id, approvals_t.c.operation_id == operation_id)
        .order_by(approvals_t.c.id)
    ).mappings()
    return [Approval.from_row(r) for r in rows]


def evaluate(
    approvals: Iterable[Approval], digest: str | None, now: datetime
) -> tuple[Approval | None, str | None]:
    """``(approval, None)`` when one matching approval is valid at ``now`` (the newest),
    else ``(None, reason)``: missing, mismatch (approvals exist, none for this digest),
    revoked or expired (the newest matching approval's state; revoked wins)."""
    every = sorted(approvals, key=lambda a: a.id)
    if not every:
        return None, APPROVAL_MISSING
    matching = [a for a in every if digest is not None and a.payload_hash == digest]
    valid = [a for a in matching if a.valid_at(now)]
    if valid:
        return valid[-1], None
    if not matching:
        return None, APPROVAL_MISMATCH
    return None, APPROVAL_REVOKED if matching[-1].revoked_at is not None else APPROVAL_EXPIRED


def _event(op: OperationRecord, kind: str, actor: str, reason: str | None,
           detail: dict[str, Any]) -> dict[str, Any]:
    return {"tenant_id": op.tenant_id, "task_id": op.task_id, "operation_id": op.operation_id,
            "kind": kind, "from_status": op.status.value, "to_status": op.status.value,
            "actor": actor, "reason": reason, "detail": detail}


def approve(
    conn: Connection | Session,
    *,
    tenant_id: str,
    operation_id: str,
    actor: str,
    expires_at: datetime | None = None,
    expires_in: timedelta | None = None,
    reason: str | None = None,
    release: bool = True,
) -> ApprovalResult:
    """Approve the operation's current payload (in the caller's transaction).

    ``expires_at`` (aware datetime) or ``expires_in`` (from now on the database clock);
    neither: no expiry. An operation ``blocked`` only for want of an approval (an approval
    reason) is released to ``pending`` in the same transaction, recorded as a transition
    by ``actor``: the approval is the person's decision to send. ``release=False`` records
    the approval and leaves the operation where it is."""
    c = connection_of(conn)
    _nonempty("actor", actor)
    if expires_at is not None and expires_in is not None:
        raise errors.ApprovalError("give expires_at or expires_in, not both")
    op = _operation(c, tenant_id, operation_id)
    if not op.requires_approval:
        raise errors.ApprovalError("the operation does not require approval",
                                   operation_id=operation_id)
    if op.status in TERMINAL:
        raise errors.ApprovalError("the operation is finished", operation_id=operation_id,
                                   status=op.status.value)
    digest = operation_digest(op)
    expiry: Any = None
    if expires_in is not None:
        if expires_in.total_seconds() <= 0:
            raise errors.ApprovalError("expires_in must be positive")
        expiry = db_now(expires_in.total_seconds())
    elif expires_at is not None:
        if expires_at.tzinfo is None:
            raise errors.ApprovalError("expires_at must be timezone-aware")
        if expires_at <= c.execute(sa.select(db_now())).scalar_one():
            raise errors.ApprovalError("expires_at is not in the future")
        expiry = expires_at
    row = c.execute(
        sa.insert(approvals_t)
        .values(tenant_id=tenant_id, operation_id=operation_id, payload_hash=digest,
                approved_by=actor, reason=reason, expires_at=expiry)
        .returning(*approvals_t.c)
    ).mappings().one()
    approval = Approval.from_row(row)
    detail = {"approval_id": approval.id, "payload_hash": digest,
              "expires_at": approval.expires_at.isoformat() if approval.expires_at else None}
    c.execute(sa.insert(events_t).values(**_event(op, "approval", actor, reason, detail)))
    released = False
    if release and op.status == OperationStatus.BLOCKED and op.status_reason in APPROVAL_REASONS:
        released = _requeue(c, op, actor)
    if released:
        return ApprovalResult(approval, True, OperationStatus.PENDING, None)
    return ApprovalResult(approval, False, op.status, op.status_reason)


def _requeue(conn: Connection, op: OperationRecord, actor: str) -> bool:
    moved = conn.execute(
        sa.update(ops_t)
        .where(ops_t.c.id == op.id, ops_t.c.state_revision == op.state_revision,
               ops_t.c.status == OperationStatus.BLOCKED.value)
        .values(status=checked_move(OperationStatus.BLOCKED, OperationStatus.PENDING),
                status_reason=None, next_attempt_at=None,
                state_revision=ops_t.c.state_revision + 1, updated_at=db_now())
    ).rowcount
    if moved:
        event = _event(op, "transition", actor, "approved: released", {"release": True})
        event["to_status"] = OperationStatus.PENDING.value
        conn.execute(sa.insert(events_t).values(**event))
    return bool(moved)


def revoke(
    conn: Connection | Session,
    *,
    tenant_id: str,
    operation_id: str,
    actor: str,
    reason: str,
) -> int:
    """Revoke every unrevoked approval of the operation (in the caller's transaction).
    Returns how many. A send already in flight cannot be recalled: the event's detail says
    so (``too_late``), and such an operation is reconciled as usual."""
    c = connection_of(conn)
    _nonempty("actor", actor)
    _nonempty("reason", reason)
    op = _operation(c, tenant_id, operation_id)
    ids = c.execute(
        sa.update(approvals_t)
        .where(approvals_t.c.tenant_id == tenant_id, approvals_t.c.operation_id == operation_id,
               approvals_t.c.revoked_at.is_(None))
        .values(revoked_at=db_now(), revoked_by=actor)
        .returning(approvals_t.c.id)
    ).scalars().all()
    if not ids:
        raise errors.ApprovalError("the operation has no unrevoked approval",
                                   operation_id=operation_id)
    too_late = op.status in (OperationStatus.DISPATCHING, OperationStatus.UNKNOWN) or (
        op.status in TERMINAL and op.attempts > 0)
    detail = {"approval_ids": sorted(ids), "too_late": too_late}
    c.execute(sa.insert(events_t).values(**_event(op, "revocation", actor, reason, detail)))
    return len(ids)
