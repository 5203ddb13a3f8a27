"""Retention by record type, legal holds, and tenant erasure: the purge path.

:func:`purge` applies the configured periods (``[retention]``):

* payload bodies of **finished** operations (applied, verified, rejected, cancelled) older
  than ``payload_days`` (since their last change) become the JSON value ``null`` with
  ``payload_purged_at`` set; ``payload_digest`` stays (filled first where a plain-SQL row
  never got one), so the evidence still says *which* body was sent;
* receipts of finished operations older than ``receipt_days`` become NULL
  (``receipt_purged_at``), and so does their attempts' ``evidence`` (response excerpts);
* attempts, events and approvals older than their periods are deleted, unless they belong
  to an operation that is not finished (or, for task-level events, to a task with one);
* a task under legal hold (``legal_hold_owner`` set) stops every purge of its records until
  the hold is lifted; a hold past ``legal_hold_review_at`` still holds and is counted as
  overdue for review;
* an operation still ``pending`` or ``blocked`` whose payload period has passed is never
  dispatched on expired data and never guessed: it becomes ``blocked`` /
  ``retention_expired`` and keeps its payload until a person resolves it (cancelled, it is
  purged by a later run). Leased (``claimed``/``dispatching``) and ``unknown`` operations
  are left to the dispatcher and reconciliation and keep their payloads; they are counted.

:func:`erase_tenant` removes one tenant's bodies and free-form personal data at once
(payloads, receipts, task state, event details, attempt evidence, approval reasons) and
keeps the minimised effect evidence: ids, digests, statuses, actors and timestamps.

Writes go through the retention path the database rules allow, which each store opens its
own way (:meth:`dispatcher.store.interface.Store.retention_path` — PostgreSQL: ``SET LOCAL
outbox.retention_purge = 'on'``; SQLite: a transient ``outbox_meta`` row); on PostgreSQL
the role must be the retention role (or the owner). See docs/security-model.md. Callers go
through the store (``store.purge``, ``store.erase_tenant``), in one transaction of theirs.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from dataclasses import asdict, dataclass
from datetime import datetime, timedelta
from typing import Any, Protocol

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from outbox import errors, schema
from outbox.digest import payload_digest
from outbox.states import TERMINAL, OperationStatus, checked_move
from outbox.types import db_now, in_pairs

ops, tasks, events = schema.operations, schema.tasks, schema.events
attempts, approvals, meta = schema.attempts, schema.approvals, schema.meta
ACTOR = "outbox-retention"
EXPIRED = "retention_expired"
ERASED = "tenant_erased"
DEFAULT_LIMIT = 10_000
_FINISHED = sorted(s.value for s in TERMINAL)
_RESUMABLE = [OperationStatus.PENDING.value, OperationStatus.BLOCKED.value]
_IN_FLIGHT = ["claimed", "dispatching", "unknown"]


class RetentionPeriods(Protocol):
    """Days each record type is kept (``dispatcher.config.RetentionConfig`` is one)."""

    @property
    def payload_days(self) -> float: ...
    @property
    def receipt_days(self) -> float: ...
    @property
    def attempts_days(self) -> float: ...
    @property
    def events_days(self) -> float: ...
    @property
    def approvals_days(self) -> float: ...


class ErasureRefused(errors.OutboxError):
    """The tenant has operations in flight: erase after they settle."""


@dataclass(frozen=True)
class PurgeCounts:
    payloads: int = 0
    receipts: int = 0
    attempts: int = 0
    events: int = 0
    approvals: int = 0
    retention_expired: int = 0
    """Unfinished operations moved to blocked / retention_expired."""
    unfinished_past_retention: int = 0
    """Leased or unknown operations past their payload period (kept; left to dispatch)."""
    held_tasks: int = 0
    holds_overdue_review: int = 0
    dry_run: bool = False

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


class RetentionPath(Protocol):
    """Opens the database rules' retention path for the rest of a block, in the same
    transaction (each store's ``retention_path``: a ``SET LOCAL`` on PostgreSQL, a
    transient ``outbox_meta`` row on SQLite)."""

    def __call__(self, conn: Connection) -> AbstractContextManager[None]: ...


def _held(tenant: Any, task: Any) -> Any:
    return sa.exists().where(
        tasks.c.tenant_id == tenant, tasks.c.task_id == task, tasks.c.legal_hold_owner.isnot(None)
    )


def _needed(table: sa.Table) -> Any:
    """Rows of ``table`` an unfinished or held operation (or task) still needs."""
    o = ops.alias("needing")
    same_op = o.c.operation_id == table.c.operation_id
    if "task_id" in table.c:  # events: task-level rows follow their task
        same_op = sa.or_(same_op, sa.and_(table.c.operation_id.is_(None),
                                          o.c.task_id == table.c.task_id))
    needing = sa.exists().where(
        o.c.tenant_id == table.c.tenant_id, same_op,
        sa.or_(o.c.status.notin_(_FINISHED), _held(o.c.tenant_id, o.c.task_id)),
    )
    if "task_id" in table.c:
        return sa.or_(needing, _held(table.c.tenant_id, table.c.task_id))
    return needing


def _count(conn: Connection, table: sa.Table, where: Any) -> int:
    return int(conn.execute(sa.select(sa.func.count()).select_from(table).where(where))
               .scalar_one())


def _ids(table: sa.Table, where: Any, limit: int) -> Any:
    return table.c.id.in_(sa.select(table.c.id).where(where).order_by(table.c.id).limit(limit))


def _fill_digests(conn: Connection, where: Any, limit: int) -> None:
    rows = conn.execute(sa.select(ops.c.id, ops.c.payload)
                        .where(where, ops.c.payload_digest.is_(None)).limit(limit)).all()
    for op_id, payload in rows:
        try:
            digest = payload_digest(payload)
        except Exception:  # an inadmissible body: nothing to digest, purge it anyway
            continue
        conn.execute(sa.update(ops).where(ops.c.id == op_id, ops.c.payload_digest.is_(None))
                     .values(payload_digest=digest))


def _block(conn: Connection, where: Any, reason: str, actor: str, limit: int) -> int:
    """Resumable operations matching ``where`` -> blocked/``reason``, with their events."""
    found = conn.execute(
        sa.select(ops.c.id, ops.c.state_revision, ops.c.status, ops.c.tenant_id,
                  ops.c.task_id, ops.c.operation_id)
        .where(where, ops.c.status.in_(_RESUMABLE)).order_by(ops.c.id).limit(limit)
    ).all()
    if not found:
        return 0
    moved = set(conn.execute(
        sa.update(ops)
        .where(in_pairs((ops.c.id, ops.c.state_revision),
                        [(r.id, r.state_revision) for r in found], searched=1),
               ops.c.status.in_(_RESUMABLE))
        .values(status=checked_move((OperationStatus.PENDING, OperationStatus.BLOCKED),
                                    OperationStatus.BLOCKED), status_reason=reason,
                state_revision=ops.c.state_revision + 1, updated_at=db_now())
        .returning(ops.c.id)
    ).scalars())
    rows = [{"tenant_id": r.tenant_id, "task_id": r.task_id, "operation_id": r.operation_id,
             "kind": "transition", "from_status": r.status, "to_status": "blocked",
             "actor": actor, "reason": reason} for r in found if r.id in moved]
    if rows:
        conn.execute(sa.insert(events), rows)
    return len(rows)


def purge(
    conn: Connection,
    config: RetentionPeriods,
    *,
    retention_path: RetentionPath,
    now: datetime | None = None,
    dry_run: bool = False,
    limit: int = DEFAULT_LIMIT,
    actor: str = ACTOR,
) -> PurgeCounts:
    """Apply the retention periods once (in the caller's transaction; at most ``limit`` rows
    per record type, the rest next run). ``now`` defaults to the database clock.
    ``dry_run`` counts what would change and changes nothing. Returns the counts."""

    def run(conn: Connection) -> PurgeCounts:
        at = now or conn.execute(sa.select(db_now())).scalar_one()

        def before(days: float) -> datetime:
            return at - timedelta(days=days)

        finished = sa.and_(ops.c.status.in_(_FINISHED), schema.at_rest())  # its index
        free = ~_held(ops.c.tenant_id, ops.c.task_id)
        payload_due = sa.and_(finished, free, ops.c.payload_purged_at.is_(None),
                              ops.c.updated_at < before(config.payload_days))
        receipt_due = sa.and_(finished, free, ops.c.receipt_purged_at.is_(None),
                              ops.c.receipt.isnot(None),
                              ops.c.updated_at < before(config.receipt_days))
        # Attempt evidence (response excerpts) is receipt material: same period.
        evidence_due = sa.and_(attempts.c.evidence.isnot(None),
                               attempts.c.created_at < before(config.receipt_days),
                               ~_needed(attempts))
        expired = sa.and_(ops.c.created_at < before(config.payload_days),
                          ~sa.and_(ops.c.status == "blocked", ops.c.status_reason == EXPIRED))
        deletions = [(attempts, attempts.c.created_at < before(config.attempts_days)),
                     (events, events.c.created_at < before(config.events_days)),
                     (approvals, approvals.c.created_at < before(config.approvals_days))]
        deletions = [(t, sa.and_(old, ~_needed(t))) for t, old in deletions]
        hold = tasks.c.legal_hold_owner.isnot(None)
        overdue = sa.and_(hold, tasks.c.legal_hold_review_at < at)
        common: dict[str, Any] = {
            "held_tasks": _count(conn, tasks, hold),
            "holds_overdue_review": _count(conn, tasks, overdue),
            "unfinished_past_retention": _count(conn, ops, sa.and_(
                expired, ops.c.status.in_(_IN_FLIGHT))),
        }
        if dry_run:
            return PurgeCounts(
                payloads=min(limit, _count(conn, ops, payload_due)),
                receipts=min(limit, _count(conn, ops, receipt_due)),
                attempts=min(limit, _count(conn, attempts, deletions[0][1])),
                events=min(limit, _count(conn, events, deletions[1][1])),
                approvals=min(limit, _count(conn, approvals, deletions[2][1])),
                retention_expired=min(limit, _count(conn, ops, sa.and_(
                    expired, ops.c.status.in_(_RESUMABLE)))),
                dry_run=True, **common)
        with retention_path(conn):
            _fill_digests(conn, payload_due, limit)
            payloads = conn.execute(sa.update(ops).where(_ids(ops, payload_due, limit))
                                    .values(payload=sa.JSON.NULL, payload_purged_at=at))
            receipts = conn.execute(sa.update(ops).where(_ids(ops, receipt_due, limit))
                                    .values(receipt=sa.null(), receipt_purged_at=at))
            deleted = [conn.execute(sa.delete(t).where(_ids(t, where, limit))).rowcount
                       for t, where in deletions]
            conn.execute(sa.update(attempts).where(_ids(attempts, evidence_due, limit))
                         .values(evidence=sa.null()))
            blocked = _block(conn, expired, EXPIRED, actor, limit)
        return PurgeCounts(payloads=payloads.rowcount, receipts=receipts.rowcount,
                           attempts=deleted[0], events=deleted[1], approvals=deleted[2],
                           retention_expired=blocked, **common)

    return run(conn)


@dataclass(frozen=True)
class EraseCounts:
    payloads: int = 0
    receipts: int = 0
    task_states: int = 0
    event_details: int = 0
    attempt_evidence: int = 0
    approval_reasons: int = 0
    blocked: int = 0
    held_tasks: int = 0
    external_refs: int = 0
    """Operations whose body lives in an artifact store (``payload_ref``): delete there too."""
    dry_run: bool = False

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def erase_tenant(
    conn: Connection,
    tenant_id: str,
    *,
    retention_path: RetentionPath,
    actor: str,
    reason: str,
    dry_run: bool = False,
) -> EraseCounts:
    """Remove ``tenant_id``'s payloads and personal data, keeping minimised evidence.

    Refused (:class:`ErasureRefused`) while any of the tenant's operations is claimed,
    dispatching or unknown: an effect that may be under way is settled first. Pending and
    blocked operations become ``blocked`` / ``tenant_erased`` (never dispatched without
    their data). Tasks under legal hold are skipped and counted. The erasure itself is
    recorded as a ``tenant_erased`` event naming ``actor`` and ``reason``.
    """
    if not tenant_id.strip() or not actor.strip() or not reason.strip():
        raise errors.InvalidPayload("erase needs a tenant, an actor and a reason")

    def run(conn: Connection) -> EraseCounts:
        mine = ops.c.tenant_id == tenant_id
        in_flight = _count(conn, ops, sa.and_(mine, ops.c.status.in_(_IN_FLIGHT)))
        if in_flight:
            raise ErasureRefused(tenant_id=tenant_id, in_flight=in_flight)
        at = conn.execute(sa.select(db_now())).scalar_one()
        free_op = sa.and_(mine, ~_held(ops.c.tenant_id, ops.c.task_id))
        o = ops.alias("owner")

        def free_child(t: sa.Table) -> Any:  # not a record of a held task's operation
            held = sa.exists().where(o.c.tenant_id == t.c.tenant_id,
                                     o.c.operation_id == t.c.operation_id,
                                     _held(o.c.tenant_id, o.c.task_id))
            return sa.and_(t.c.tenant_id == tenant_id, ~held)

        plan: list[tuple[str, sa.Table, Any, dict[str, Any]]] = [
            ("payloads", ops, sa.and_(free_op, ops.c.payload_purged_at.is_(None)),
             {"payload": sa.JSON.NULL, "payload_purged_at": at}),
            ("receipts", ops, sa.and_(free_op, ops.c.receipt.isnot(None)),
             {"receipt": sa.null(), "receipt_purged_at": at}),
            ("task_states", tasks, sa.and_(tasks.c.tenant_id == tenant_id,
                                           tasks.c.legal_hold_owner.is_(None),
                                           sa.or_(tasks.c.state.isnot(None),
                                                  tasks.c.cancel_reason.isnot(None))),
             {"state": sa.null(), "cancel_reason": sa.null()}),
            ("event_details", events, sa.and_(
                free_child(events), events.c.detail.isnot(None),
                ~_held(events.c.tenant_id, events.c.task_id)), {"detail": sa.null()}),
            ("attempt_evidence", attempts, sa.and_(free_child(attempts),
                                                   attempts.c.evidence.isnot(None)),
             {"evidence": sa.null()}),
            ("approval_reasons", approvals, sa.and_(free_child(approvals),
                                                    approvals.c.reason.isnot(None)),
             {"reason": sa.null()}),
        ]
        counts: dict[str, Any] = {
            "held_tasks": _count(conn, tasks, sa.and_(tasks.c.tenant_id == tenant_id,
                                                      tasks.c.legal_hold_owner.isnot(None))),
            "external_refs": _count(conn, ops, sa.and_(free_op, ops.c.payload_ref.isnot(None))),
        }
        if dry_run:
            counts.update({name: _count(conn, t, where) for name, t, where, _ in plan})
            counts["blocked"] = _count(conn, ops, sa.and_(free_op, ops.c.status.in_(_RESUMABLE)))
            return EraseCounts(dry_run=True, **counts)
        with retention_path(conn):
            counts["blocked"] = _block(conn, free_op, ERASED, actor, 2**31 - 1)
            for name, t, where, values in plan:
                counts[name] = conn.execute(sa.update(t).where(where).values(**values)).rowcount
            conn.execute(sa.insert(events).values(
                tenant_id=tenant_id, kind=ERASED, actor=actor, reason=reason,
                detail={k: v for k, v in counts.items() if isinstance(v, int)}))
        return EraseCounts(**counts)

    return run(conn)
