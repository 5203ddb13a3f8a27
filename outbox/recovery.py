"""The resume decision procedure: what a restarted agent may do next, from durable evidence.

An agent calls :func:`plan` first when it restarts, in its own transaction (read only):
it never asks a model what it remembers. For every operation of the task the plan gives
the allowed next step of the recovery table (seed 000, "Resume interrupted agents with a
decision procedure") and the evidence it used:

====================================================  ===============================
Durable evidence                                      Step
====================================================  ===============================
task has no staged operation (computation pending)    ``recompute`` (task level)
``pending``/``claimed``, never possibly dispatched;   ``revalidate``: checks run again
``blocked`` for authority (approval, policy)          before any send
``dispatching``, ``unknown``; ``pending`` after an    ``reconcile`` with the effect
ambiguous attempt (same-key re-send or look-up)       owner, never a blind re-send
``applied`` and the provider has a verifier           ``verify``, without re-sending
``verified``; ``applied`` with no verifier            ``continue`` from that result
``rejected`` (a definite refusal)                     ``accept_refusal``: never re-sent
operations in different states (a partial batch)      ``recover_each`` (task level):
                                                      each by its own step
``blocked`` otherwise (artifact, version, deadline,   ``escalate``: preserve the block,
budget, needs_operator...), ``cancelled``, task       hand the recovery record to a
cancelled, verification failed                        person
====================================================  ===============================

:meth:`RecoveryPlan.records` gives one JSON recovery record per operation in the shape of
seed 000's example; references name retained rows (``outbox_events/17``), never values.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import asdict, dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection
from sqlalchemy.orm import Session

from outbox import errors, schema, states
from outbox.api import list_operations
from outbox.approvals import APPROVAL_REASONS, Approval, evaluate
from outbox.db import connection_of
from outbox.digest import payload_digest
from outbox.records import OperationRecord
from outbox.states import OperationStatus
from outbox.tenancy import set_tenant
from outbox.types import db_now

S = OperationStatus
SCHEMA_VERSION = 1
MAX_EVENT_REFS = 20
VERIFIER_META_PREFIX = "verifier:"
"""``outbox_meta`` rows (tenant ``*``) the daemon's verifier publishes: ``verifier:NAME``
= ``1`` when provider NAME implements ``verify``, ``0`` when it does not."""
VERIFICATION_FAILED = "verification_failed"
MAYBE_APPLIED = states.MAYBE_APPLIED
#: Blocked reasons that new authority clears (then ``outboxd ops requeue``).
AUTHORITY_REASONS = APPROVAL_REASONS | {"policy_denied"}


class Step(StrEnum):
    RECOMPUTE = "recompute"
    REVALIDATE = "revalidate"
    RECONCILE = "reconcile"
    VERIFY = "verify"
    CONTINUE = "continue"
    ACCEPT_REFUSAL = "accept_refusal"
    RECOVER_EACH = "recover_each"
    ESCALATE = "escalate"


PHASES: Mapping[Step, str] = {
    Step.RECOMPUTE: "recompute",
    Step.REVALIDATE: "revalidate_before_dispatch",
    Step.RECONCILE: "reconcile_effect",
    Step.VERIFY: "verify_effect",
    Step.CONTINUE: "continue_from_result",
    Step.ACCEPT_REFUSAL: "effect_refused",
    Step.RECOVER_EACH: "recover_each_operation",
    Step.ESCALATE: "blocked_escalated",
}
"""The recovery record's ``phase`` for each step."""


@dataclass(frozen=True)
class AttemptEvidence:
    ref: str
    attempt: int
    result_class: str
    status_code: int | None
    transport_phase: str | None
    started_at: datetime | None
    finished_at: datetime | None
    evidence_ref: str | None


@dataclass(frozen=True)
class Evidence:
    """What the step was decided from (identifiers and references only, no payload)."""

    status: str
    status_reason: str | None
    attempts: int
    last_outcome: str | None
    last_attempt: AttemptEvidence | None
    receipt_present: bool
    approval: str
    """not_required, missing, valid, consumed, expired, revoked or mismatch."""
    approval_ref: str | None
    event_refs: tuple[str, ...]
    attempt_refs: tuple[str, ...]
    first_dispatched_at: datetime | None
    deadline_passed: bool
    has_verifier: bool


@dataclass(frozen=True)
class OperationPlan:
    operation_id: str
    provider: str
    step: Step
    why: str
    evidence: Evidence
    record: dict[str, Any]


@dataclass(frozen=True)
class RecoveryPlan:
    tenant_id: str
    task_id: str
    task_found: bool
    workflow_version: str | None
    state_revision: int | None
    task_phase: str | None
    cancelled: bool
    step: Step
    """The task as a whole; ``recover_each`` when its operations need different steps."""
    why: str
    partial_batch: bool
    operations: tuple[OperationPlan, ...]
    task_record: dict[str, Any]

    def records(self) -> list[dict[str, Any]]:
        """One recovery record per operation (the task's own when none is staged)."""
        return [o.record for o in self.operations] or [self.task_record]

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = jsonable(asdict(self))
        return data


def jsonable(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, Mapping):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable(v) for v in value]
    return value


def published_verifiers(conn: Connection) -> frozenset[str]:
    """Providers the daemon's verifier declared able to ``verify``."""
    m = schema.meta
    rows = conn.execute(
        sa.select(m.c.name).where(
            m.c.tenant_id == "*", m.c.name.startswith(VERIFIER_META_PREFIX), m.c.value == "1"
        )
    ).scalars()
    return frozenset(n[len(VERIFIER_META_PREFIX) :] for n in rows)


def _by_op(
    conn: Connection, table: sa.Table, tenant_id: str, ids: Sequence[str]
) -> dict[str, list[Mapping[str, Any]]]:
    found: dict[str, list[Mapping[str, Any]]] = {i: [] for i in ids}
    if ids:
        for row in conn.execute(
            sa.select(table)
            .where(table.c.tenant_id == tenant_id, table.c.operation_id.in_(list(ids)))
            .order_by(table.c.id)
        ).mappings():
            found[row["operation_id"]].append(dict(row))
    return found


def approval_state(
    op: OperationRecord, approvals: Sequence[Mapping[str, Any]], now: datetime
) -> tuple[str, int | None]:
    """The state of the operation's approval (the dispatcher's rule,
    :func:`outbox.approvals.evaluate`) and the approval row it is based on."""
    if not approvals:
        return ("not_required" if not op.requires_approval else "missing"), None
    digest = op.payload_digest
    if digest is None and isinstance(op.payload, dict):
        digest = payload_digest(op.payload)
    found, reason = evaluate([Approval.from_row(a) for a in approvals], digest, now)
    if found is not None:
        return ("consumed" if found.consumed_at is not None else "valid"), found.id
    return (reason or "missing").removeprefix("approval_"), int(approvals[-1]["id"])


def classify(op: OperationRecord, ev: Evidence, *, task_cancelled: bool) -> tuple[Step, str]:
    """The allowed next step for one operation, and why (pure: no I/O)."""
    maybe = op.last_outcome in MAYBE_APPLIED
    st, reason = op.status, op.status_reason
    if st in (S.DISPATCHING, S.UNKNOWN):
        why = "dispatch may have occurred and no terminal outcome is recorded"
        if task_cancelled:
            why += "; the task is cancelled but this cannot be recalled"
        return Step.RECONCILE, why + (f" ({reason})" if reason else "")
    if st in (S.PENDING, S.CLAIMED):
        if task_cancelled:
            return Step.ESCALATE, "the task is cancelled: it will not be dispatched"
        if ev.deadline_passed:
            return Step.ESCALATE, "its deadline has passed: nothing is sent after it"
        if maybe:
            return Step.RECONCILE, (
                f"an earlier attempt may have been applied ({op.last_outcome}): only a "
                "same-key re-send inside the receiver's dedup window, else a look-up"
            )
        if op.requires_approval and ev.approval not in ("valid", "consumed"):
            return Step.REVALIDATE, f"never dispatched; approval {ev.approval}: approve first"
        return Step.REVALIDATE, "never dispatched: authority and inputs are checked again first"
    if st == S.BLOCKED:
        if reason in AUTHORITY_REASONS and not maybe and not task_cancelled:
            return Step.REVALIDATE, f"blocked for authority ({reason}): renew it, then requeue"
        return Step.ESCALATE, f"blocked ({reason or 'unspecified'}): needs a person"
    if st == S.APPLIED:
        if reason == VERIFICATION_FAILED:
            return Step.ESCALATE, "applied but its verification failed: never re-sent"
        if ev.has_verifier:
            return Step.VERIFY, "applied, not yet verified: run the verifier, never re-send"
        return Step.CONTINUE, "applied with a receipt (the provider has no verifier)"
    if st == S.VERIFIED:
        return Step.CONTINUE, "applied and verified"
    if st == S.REJECTED:
        return Step.ACCEPT_REFUSAL, f"definitely refused ({reason}): a change is a new operation"
    return Step.ESCALATE, f"cancelled ({reason or 'unspecified'}): preserved, not dispatched"


def plan(
    conn: Connection | Session,
    *,
    tenant_id: str,
    task_id: str,
    verifiers: Collection[str] | None = None,
) -> RecoveryPlan:
    """The recovery plan of one task, read in the caller's transaction (writes nothing).

    ``verifiers``: names of providers that implement ``verify``; by default those the
    daemon published. Raises :class:`~outbox.errors.TaskNotFound` when neither a task row
    nor any operation of that task exists.
    """
    c = connection_of(conn)
    set_tenant(c, tenant_id)
    t = schema.tasks
    task = (
        c.execute(sa.select(t).where(t.c.tenant_id == tenant_id, t.c.task_id == task_id))
        .mappings()
        .first()
    )
    ops = list_operations(c, tenant_id=tenant_id, task_id=task_id)
    if task is None and not ops:
        raise errors.TaskNotFound(tenant_id=tenant_id, task_id=task_id)
    now = c.execute(sa.select(db_now())).scalar_one()
    verifying = published_verifiers(c) if verifiers is None else frozenset(verifiers)
    ids = [o.operation_id for o in ops]
    events = _by_op(c, schema.events, tenant_id, ids)
    attempts = _by_op(c, schema.attempts, tenant_id, ids)
    approvals = _by_op(c, schema.approvals, tenant_id, ids)
    cancelled = task is not None and task["cancelled_at"] is not None
    task_deadline = task["deadline_at"] if task is not None else None
    workflow = task["workflow_version"] if task is not None else None
    revision = int(task["state_revision"]) if task is not None else None
    limits_ref = f"outbox_tasks/{task['id']}/limits" if task is not None else None

    def record(op: OperationRecord | None, step: Step, ev: Evidence | None) -> dict[str, Any]:
        refs = list(ev.attempt_refs + ev.event_refs) if ev else []
        return {
            "schema_version": SCHEMA_VERSION,
            "task_id": task_id,
            "workflow_version": (op.workflow_version if op else None) or workflow,
            "state_revision": revision,
            "phase": PHASES[step],
            "operation_id": op.operation_id if op else None,
            "payload_ref": (op.payload_ref or f"outbox_operations/{op.id}/payload") if op else None,
            "payload_digest": op.payload_digest if op else None,
            "effect_status": op.status.value if op else None,
            "receipt_ref": f"outbox_operations/{op.id}/receipt"
            if op and ev and ev.receipt_present
            else None,
            "authorization_ref": ev.approval_ref if ev else None,
            "limits_ref": limits_ref or (f"outbox_operations/{op.id}/limits" if op else None),
            "evidence_refs": refs,
            "next_step": step.value,
        }

    planned: list[OperationPlan] = []
    for op in ops:
        tries = attempts[op.operation_id]
        last = tries[-1] if tries else None
        approval, approval_id = approval_state(op, approvals[op.operation_id], now)
        deadlines = [d for d in (op.deadline_at, task_deadline) if d is not None]
        ev = Evidence(
            status=op.status.value,
            status_reason=op.status_reason,
            attempts=op.attempts,
            last_outcome=op.last_outcome,
            last_attempt=None
            if last is None
            else AttemptEvidence(
                ref=f"outbox_attempts/{last['id']}",
                attempt=int(last["attempt"]),
                result_class=str(last["result_class"]),
                status_code=last["status_code"],
                transport_phase=last["transport_phase"],
                started_at=last["started_at"],
                finished_at=last["finished_at"],
                evidence_ref=last["evidence_ref"],
            ),
            receipt_present=op.receipt is not None,
            approval=approval,
            approval_ref=None if approval_id is None else f"outbox_approvals/{approval_id}",
            event_refs=tuple(
                f"outbox_events/{e['id']}" for e in events[op.operation_id][-MAX_EVENT_REFS:]
            ),
            attempt_refs=tuple(f"outbox_attempts/{a['id']}" for a in tries),
            first_dispatched_at=op.first_dispatched_at,
            deadline_passed=any(d <= now for d in deadlines),
            has_verifier=op.provider in verifying,
        )
        step, why = classify(op, ev, task_cancelled=cancelled)
        planned.append(
            OperationPlan(op.operation_id, op.provider, step, why, ev, record(op, step, ev))
        )
    steps = {p.step for p in planned}
    partial = len(steps) > 1
    if cancelled:
        step, why = Step.ESCALATE, "the task is cancelled: nothing new is dispatched"
    elif not planned:
        if task_deadline is not None and task_deadline <= now:
            step, why = Step.ESCALATE, "the task's deadline has passed"
        else:
            step, why = Step.RECOMPUTE, "no effect is staged: recompute from retained inputs"
    elif partial:
        step, why = Step.RECOVER_EACH, "partial batch: recover each operation by its own step"
    else:
        step, why = planned[0].step, planned[0].why
    return RecoveryPlan(
        tenant_id=tenant_id,
        task_id=task_id,
        task_found=task is not None,
        workflow_version=workflow,
        state_revision=revision,
        task_phase=task["phase"] if task is not None else None,
        cancelled=cancelled,
        step=step,
        why=why,
        partial_batch=partial,
        operations=tuple(planned),
        task_record=record(None, step, None),
    )
