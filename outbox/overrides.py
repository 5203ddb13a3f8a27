"""Operator overrides: the one audited path by which a person moves an operation on.

``outboxd ops resolve|requeue|cancel`` (and any later console) call these functions; they
run in the caller's transaction (never begin, commit or retry). Every override is

* allowed by :data:`outbox.states.OVERRIDES` (``check_transition(..., override=True)``),
* a conditional UPDATE on ``(id, state_revision, status)`` as read: if a dispatcher or
  another operator moved the row meanwhile, nothing is written and
  :class:`ConcurrentChange` is raised,
* recorded in ``outbox_events`` (kind ``override``: actor, reason, from/to status,
  evidence reference) in the same transaction.

Uncertainty is never silently turned into success: marking an operation ``applied``
requires an evidence reference; so does declaring it not applied (``resolve
--outcome not_applied``, or requeueing an ``unknown`` one). Requeueing keeps the
idempotency key; requeueing a ``blocked`` row without evidence keeps its last outcome, so
the dispatcher still treats a re-send of a possibly applied effect as blind (same key,
inside the receiver's dedup window only). Operations that may already have been
dispatched cannot be cancelled: they are reconciled.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import sqlalchemy as sa
from sqlalchemy.engine import Connection
from sqlalchemy.orm import Session

from outbox import errors, schema
from outbox.db import connection_of
from outbox.records import OperationRecord
from outbox.recovery import MAYBE_APPLIED
from outbox.states import OperationStatus, check_transition
from outbox.tenancy import set_tenant
from outbox.types import db_now

S = OperationStatus
ops_t, events_t, tasks_t = schema.operations, schema.events, schema.tasks
Outcome = Literal["applied", "not_applied", "rejected"]
OUTCOMES: tuple[str, ...] = ("applied", "not_applied", "rejected")
NOT_APPLIED = "reconciled_not_applied"
MAX_TEXT = 2000


class OverrideRefused(errors.OutboxError):
    """The override was refused; nothing was written."""


class EvidenceRequired(OverrideRefused):
    """This override needs an evidence reference (--evidence): a ticket, a provider
    dashboard link, a support case id."""


class CannotRecall(OverrideRefused):
    """The operation may already have been dispatched: it cannot be recalled, only
    reconciled with the provider (or resolved with evidence by a person)."""


class ConcurrentChange(OverrideRefused):
    """The operation changed while the override was applied; look at it again."""


@dataclass(frozen=True)
class OverrideResult:
    tenant_id: str
    operation_id: str
    from_status: str
    to_status: str
    state_revision: int
    event_id: int


def _text(name: str, value: str | None, *, required: bool = True) -> str | None:
    if value is None or not str(value).strip():
        if required:
            raise OverrideRefused(f"{name} is required for an override", field=name)
        return None
    if len(value) > MAX_TEXT:
        raise OverrideRefused(f"{name} is longer than {MAX_TEXT} characters", field=name)
    if "\x00" in value:  # PostgreSQL's text holds no U+0000: refused the same everywhere
        raise OverrideRefused(f"{name} holds a NUL character: remove it", field=name)
    return value.strip()


def _task_cancelled(conn: Connection, op: OperationRecord) -> bool:
    return (
        conn.execute(
            sa.select(tasks_t.c.id).where(
                tasks_t.c.tenant_id == op.tenant_id,
                tasks_t.c.task_id == op.task_id,
                tasks_t.c.cancelled_at.isnot(None),
            )
        ).first()
        is not None
    )


def _apply(
    conn: Connection,
    op: OperationRecord,
    to: OperationStatus,
    *,
    actor: str,
    reason: str,
    evidence: str | None,
    status_reason: str,
    values: dict[str, Any],
    detail: dict[str, Any],
) -> OverrideResult:
    check_transition(op.status, to, override=True)
    row = conn.execute(
        sa.update(ops_t)
        .where(
            ops_t.c.id == op.id,
            ops_t.c.state_revision == op.state_revision,
            ops_t.c.status == op.status.value,
        )
        .values(
            status=to.value,
            status_reason=status_reason,
            lease_owner=None,
            lease_expires_at=None,
            state_revision=ops_t.c.state_revision + 1,
            updated_at=db_now(),
            **values,
        )
        .returning(ops_t.c.state_revision)
    ).first()
    if row is None:
        raise ConcurrentChange(operation_id=op.operation_id, expected_status=op.status.value)
    event_id = conn.execute(
        sa.insert(events_t)
        .values(
            tenant_id=op.tenant_id,
            task_id=op.task_id,
            operation_id=op.operation_id,
            kind="override",
            from_status=op.status.value,
            to_status=to.value,
            actor=actor,
            reason=reason,
            evidence_ref=evidence,
            detail={"state_revision": int(row[0]), "status_reason": status_reason, **detail},
            fencing_token=op.fencing_token,
        )
        .returning(events_t.c.id)
    ).scalar_one()
    return OverrideResult(
        op.tenant_id, op.operation_id, op.status.value, to.value, int(row[0]), int(event_id)
    )


def _load(conn: Connection, tenant_id: str, operation_id: str) -> OperationRecord:
    """The row without its bodies (the operator role may not read payload or receipt)."""
    set_tenant(conn, tenant_id)
    columns = [col for col in ops_t.c if col.name not in ("payload", "receipt")]
    row = (
        conn.execute(
            sa.select(*columns).where(
                ops_t.c.tenant_id == tenant_id, ops_t.c.operation_id == operation_id
            )
        )
        .mappings()
        .first()
    )
    if row is None:
        raise errors.OperationNotFound(tenant_id=tenant_id, operation_id=operation_id)
    return OperationRecord.from_row({**row, "payload": None, "receipt": None})


def resolve(
    conn: Connection | Session,
    *,
    tenant_id: str,
    operation_id: str,
    outcome: Outcome | str,
    actor: str,
    reason: str,
    evidence: str,
) -> OverrideResult:
    """A person establishes the outcome of an ``unknown`` or ``blocked`` operation.

    ``applied``: the effect exists (``evidence`` says where it was seen); ``not_applied``:
    it does not, so it is requeued (``pending``, same idempotency key, last outcome
    ``reconciled_not_applied``); ``rejected``: the receiver refused it for good. An
    evidence reference is always required.
    """
    c = connection_of(conn)
    if outcome not in OUTCOMES:
        raise OverrideRefused(f"outcome must be one of {', '.join(OUTCOMES)}", outcome=outcome)
    who, why = _text("actor", actor), _text("reason", reason)
    ref = _text("evidence", evidence, required=False)
    if ref is None:
        raise EvidenceRequired(operation_id=operation_id, outcome=outcome)
    op = _load(c, tenant_id, operation_id)
    if op.status in (S.DISPATCHING, S.CLAIMED):
        raise OverrideRefused(
            "a dispatcher holds this operation; wait until it records an outcome or its "
            "lease expires (then it is 'unknown')",
            operation_id=operation_id,
            status=op.status.value,
        )
    if op.status not in (S.UNKNOWN, S.BLOCKED):
        raise OverrideRefused(
            "only 'unknown' or 'blocked' operations are resolved",
            operation_id=operation_id,
            status=op.status.value,
        )
    values: dict[str, Any] = {}
    if outcome == "applied":
        to, status_reason = S.APPLIED, "operator_resolved_applied"
        values["last_outcome"] = "resolved_applied"  # the evidence is the event's
    elif outcome == "rejected":
        to, status_reason = S.REJECTED, "operator_resolved_rejected"
        values["last_outcome"] = "resolved_rejected"
    else:
        if _task_cancelled(c, op):
            raise OverrideRefused("the task is cancelled: nothing is requeued", task=op.task_id)
        to, status_reason = S.PENDING, "operator_resolved_not_applied"
        values.update(last_outcome=NOT_APPLIED, next_attempt_at=None)
    assert who is not None and why is not None
    return _apply(
        c,
        op,
        to,
        actor=who,
        reason=why,
        evidence=ref,
        status_reason=status_reason,
        values=values,
        detail={"override": "resolve", "outcome": outcome},
    )


def requeue(
    conn: Connection | Session,
    *,
    tenant_id: str,
    operation_id: str,
    actor: str,
    reason: str,
    evidence: str | None = None,
) -> OverrideResult:
    """Back to ``pending`` with the same key: a ``blocked`` (or ``rejected``) operation, or
    an ``unknown`` one with evidence that it was not applied. The dispatcher runs every
    check again before sending."""
    c = connection_of(conn)
    who, why = _text("actor", actor), _text("reason", reason)
    ref = _text("evidence", evidence, required=False)
    op = _load(c, tenant_id, operation_id)
    if op.status == S.UNKNOWN and ref is None:
        raise EvidenceRequired(
            "requeueing an 'unknown' operation needs evidence that it was not applied",
            operation_id=operation_id,
        )
    if op.status in (S.DISPATCHING, S.CLAIMED):
        raise OverrideRefused(
            "a dispatcher holds this operation; it is not requeued",
            operation_id=operation_id,
            status=op.status.value,
        )
    if op.status not in (S.BLOCKED, S.UNKNOWN, S.REJECTED):
        raise OverrideRefused(
            "only 'blocked', 'unknown' or 'rejected' operations are requeued",
            operation_id=operation_id,
            status=op.status.value,
        )
    if _task_cancelled(c, op):
        raise OverrideRefused("the task is cancelled: nothing is requeued", task=op.task_id)
    values: dict[str, Any] = {"next_attempt_at": None}
    if ref is not None and (op.status == S.UNKNOWN or op.last_outcome in MAYBE_APPLIED):
        values["last_outcome"] = NOT_APPLIED
    assert who is not None and why is not None
    return _apply(
        c,
        op,
        S.PENDING,
        actor=who,
        reason=why,
        evidence=ref,
        status_reason="operator_requeued",
        values=values,
        detail={"override": "requeue", "previous_reason": op.status_reason},
    )


def cancel(
    conn: Connection | Session,
    *,
    tenant_id: str,
    operation_id: str,
    actor: str,
    reason: str,
) -> OverrideResult:
    """``pending`` or ``blocked`` -> ``cancelled``. An operation that may already have been
    dispatched (``dispatching``, ``unknown``) cannot be recalled: :class:`CannotRecall`."""
    c = connection_of(conn)
    who, why = _text("actor", actor), _text("reason", reason)
    op = _load(c, tenant_id, operation_id)
    if op.status in (S.DISPATCHING, S.UNKNOWN):
        raise CannotRecall(
            f"operation {operation_id!r} is {op.status.value!r}: it may already have been "
            "sent and cannot be recalled; it is reconciled with the provider, or resolve it "
            "with evidence (outboxd ops resolve)",
            status=op.status.value,
        )
    if op.status == S.CLAIMED:
        raise OverrideRefused(
            "a dispatcher is checking this operation right now; try again in a moment",
            operation_id=operation_id,
        )
    assert who is not None and why is not None
    return _apply(
        c,
        op,
        S.CANCELLED,
        actor=who,
        reason=why,
        evidence=None,
        status_reason="operator_cancelled",
        values={"next_attempt_at": None},
        detail={"override": "cancel", "previous_reason": op.status_reason},
    )
