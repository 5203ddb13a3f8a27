"""What the console's pages read: one function per page, each in the caller's transaction.

Payload bodies, receipts and attempts' evidence bodies are never selected (the operator
role cannot read them either); a page shows the payload's digest, whether a receipt is
present and the evidence *references*. ``tenants`` is the logged-in user's scope (None:
every tenant); a row outside it is reported as not found.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from dispatcher.engine.outcomes import window_open
from dispatcher.status import RECENT_SECONDS
from outbox import schema, tenancy
from outbox.api import SYSTEM_ACTOR
from outbox.states import TERMINAL, OperationStatus
from outbox.types import db_now
from providers.base import Capabilities

ops, events, attempts, approvals = (schema.operations, schema.events, schema.attempts,
                                    schema.approvals)
PAGE_SIZE = 50
HOUR = 3600
LIST_FILTERS = ("tenant", "task", "provider", "status", "reason")
Scope = Collection[str] | None


class NotFound(Exception):
    """No such row in the user's scope (rendered as 404)."""


def _scoped(q: Any, table: sa.Table, tenants: Scope) -> Any:
    return q if tenants is None else q.where(table.c.tenant_id.in_(sorted(tenants)))


def _single(conn: Connection, tenants: Scope) -> None:
    """With exactly one tenant in scope, also scope the transaction (PostgreSQL RLS)."""
    if tenants is not None and len(tenants) == 1:
        tenancy.set_tenant(conn, next(iter(tenants)))


def overview(conn: Connection, tenants: Scope) -> dict[str, Any]:
    _single(conn, tenants)
    now = conn.execute(sa.select(db_now())).scalar_one()
    counts = dict.fromkeys((s.value for s in OperationStatus), 0)
    for status, n in conn.execute(
        _scoped(sa.select(ops.c.status, sa.func.count()), ops, tenants).group_by(ops.c.status)
    ):
        counts[str(status)] = int(n)
    by_reason: dict[str, dict[str, int]] = {"unknown": {}, "blocked": {}}
    for status, reason, n in conn.execute(
        _scoped(sa.select(ops.c.status, ops.c.status_reason, sa.func.count()), ops, tenants)
        .where(ops.c.status.in_(list(by_reason)))
        .group_by(ops.c.status, ops.c.status_reason)
    ):
        by_reason[str(status)][reason or "unspecified"] = int(n)
    oldest = conn.execute(
        _scoped(sa.select(sa.func.min(ops.c.created_at)), ops, tenants)
        .where(ops.c.status == OperationStatus.PENDING.value)
    ).scalar()
    replicas: dict[str, datetime] = {}
    for owner, last in conn.execute(
        _scoped(sa.select(ops.c.lease_owner, sa.func.max(ops.c.updated_at)), ops, tenants)
        .where(ops.c.status.in_(["claimed", "dispatching"]), ops.c.lease_owner.isnot(None))
        .group_by(ops.c.lease_owner)
    ):
        replicas[str(owner)] = last
    for actor, last in conn.execute(
        _scoped(sa.select(events.c.actor, sa.func.max(events.c.created_at)), events, tenants)
        .where(events.c.created_at >= db_now(-RECENT_SECONDS), events.c.kind == "transition")
        .group_by(events.c.actor)
    ):
        if actor != SYSTEM_ACTOR and (actor not in replicas or last > replicas[actor]):
            replicas[str(actor)] = last
    outcomes: dict[str, dict[str, int]] = {}
    for provider, result, n in conn.execute(
        _scoped(sa.select(attempts.c.provider, attempts.c.result_class, sa.func.count()),
                attempts, tenants)
        .where(attempts.c.created_at >= db_now(-HOUR))
        .group_by(attempts.c.provider, attempts.c.result_class)
    ):
        outcomes.setdefault(str(provider or "-"), {})[str(result)] = int(n)
    return {
        "counts": counts,
        "unknown_by_reason": by_reason["unknown"],
        "blocked_by_reason": by_reason["blocked"],
        "oldest_pending_seconds": None if oldest is None else (now - oldest).total_seconds(),
        "replicas": sorted((w, max(0.0, (now - t).total_seconds())) for w, t in replicas.items()),
        "outcomes": outcomes,
        "recent_seconds": RECENT_SECONDS,
    }


def list_operations(
    conn: Connection, tenants: Scope, filters: Mapping[str, str], *,
    before: int | None = None, older_than: float | None = None, limit: int = PAGE_SIZE,
) -> tuple[list[dict[str, Any]], int | None]:
    """One page, newest first, keyset on ``id`` (``before``: the last id of the previous
    page). Returns the rows and the ``before`` of the next page (None on the last)."""
    _single(conn, tenants)
    cols = [ops.c[c] for c in ("id", "tenant_id", "task_id", "operation_id", "provider",
                               "status", "status_reason", "attempts", "last_outcome",
                               "created_at", "updated_at")]
    now = conn.execute(sa.select(db_now())).scalar_one()
    q = _scoped(sa.select(*cols), ops, tenants)
    for name, column in (("tenant", "tenant_id"), ("task", "task_id"),
                         ("provider", "provider"), ("status", "status"),
                         ("reason", "status_reason")):
        if filters.get(name):
            q = q.where(ops.c[column] == filters[name])
    if before is not None:
        q = q.where(ops.c.id < before)
    if older_than is not None:
        q = q.where(ops.c.created_at <= db_now(-older_than))
    rows = [dict(r) for r in conn.execute(q.order_by(ops.c.id.desc()).limit(limit + 1)).mappings()]
    more = len(rows) > limit
    rows = rows[:limit]
    for r in rows:
        r["age_seconds"] = max(0.0, (now - r["created_at"]).total_seconds())
    return rows, (int(rows[-1]["id"]) if more else None)


@dataclass(frozen=True)
class ProviderView:
    capabilities: Capabilities | None
    problem: str | None = None


def _rows(conn: Connection, table: sa.Table, tenant_id: str, operation_id: str,
          columns: Collection[str] | None = None) -> list[dict[str, Any]]:
    cols = [table.c[c] for c in columns] if columns else list(table.c)
    q = sa.select(*cols).where(table.c.tenant_id == tenant_id,
                               table.c.operation_id == operation_id)
    return [dict(r) for r in conn.execute(q.order_by(table.c.id)).mappings()]


_ORDER = {"approval": 0, "attempt": 1, "event": 2}
ATTEMPT_COLUMNS = ("id", "attempt", "fencing_token", "worker", "started_at", "finished_at",
                   "result_class", "status_code", "error_class", "transport_phase",
                   "duration_ms", "evidence_ref", "created_at")


def operation(conn: Connection, tenants: Scope, tenant_id: str, operation_id: str, *,
              provider: ProviderView | None, margin: float) -> dict[str, Any]:
    """The timeline page: the row (no bodies), events, attempts, approvals, fencing tokens,
    the provider's declared capabilities and whether its dedup window is still open."""
    if tenants is not None and tenant_id not in tenants:
        raise NotFound(operation_id)
    tenancy.set_tenant(conn, tenant_id)
    row = conn.execute(
        sa.select(*(c for c in ops.c if c.name not in ("payload", "receipt")),
                  ops.c.receipt.isnot(None).label("receipt_present"), db_now().label("now"))
        .where(ops.c.tenant_id == tenant_id, ops.c.operation_id == operation_id)
    ).mappings().first()
    if row is None:
        raise NotFound(operation_id)
    op = dict(row)
    now = op.pop("now")
    evs = _rows(conn, events, tenant_id, operation_id)
    tries = _rows(conn, attempts, tenant_id, operation_id, ATTEMPT_COLUMNS)
    grants = _rows(conn, approvals, tenant_id, operation_id)
    timeline = sorted(
        [("event", e["created_at"], e) for e in evs]
        + [("attempt", a["started_at"] or a["created_at"], a) for a in tries]
        + [("approval", a["approved_at"], a) for a in grants],
        key=lambda item: (item[1] is None, item[1] or now, _ORDER[item[0]]),
    )
    tokens = sorted({int(t) for t in [*(e["fencing_token"] for e in evs),
                                      *(a["fencing_token"] for a in tries)] if t is not None})
    window: dict[str, Any] | None = None
    caps = provider.capabilities if provider else None
    if caps is not None:
        first = op["first_dispatched_at"]
        closes = None
        if first is not None and caps.dedup_retention_seconds > 0:
            closes = first.timestamp() + caps.dedup_retention_seconds * (1 - margin)
        window = {"open": window_open(caps, margin, first, now), "closes_at_epoch": closes,
                  "margin": margin, "deduplicates": caps.dedup_retention_seconds > 0}
    status = OperationStatus(op["status"])
    live = [a for a in grants if a["revoked_at"] is None]
    return {
        "op": op, "now": now, "timeline": timeline, "events": evs, "attempts": tries,
        "approvals": grants, "fencing_tokens": tokens, "provider": provider, "window": window,
        "can": {
            "resolve": status in (OperationStatus.UNKNOWN, OperationStatus.BLOCKED),
            "requeue": status in (OperationStatus.BLOCKED, OperationStatus.UNKNOWN,
                                  OperationStatus.REJECTED),
            "cancel": status in (OperationStatus.PENDING, OperationStatus.BLOCKED),
            "approve": bool(op["requires_approval"]) and status not in TERMINAL,
            "revoke": bool(live),
        },
    }


def task_in_scope(tenants: Scope, tenant_id: str, task_id: str) -> None:
    if tenants is not None and tenant_id not in tenants:
        raise NotFound(task_id)
