"""``outboxd status``: counts by status, oldest pending age, unknown and blocked by
reason, replicas seen recently (lease owners and the actors of recent transitions), as a
table or JSON. A one-off command: it counts every status exactly (the daemon's gauges
avoid that per refresh, see :mod:`dispatcher.maintenance.gauges`)."""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from dispatcher.config import Config
from dispatcher.store import store_for
from outbox import db, schema
from outbox.api import SYSTEM_ACTOR
from outbox.states import OperationStatus
from outbox.types import db_now

ops, events = schema.operations, schema.events
RECENT_SECONDS = 300


def collect(cfg: Config) -> dict[str, Any]:
    engine = db.create_engine(cfg.database.url, **cfg.database.engine_args())
    try:
        with engine.connect() as conn:
            return collect_from(conn)
    finally:
        engine.dispose()


def collect_from(conn: Connection) -> dict[str, Any]:
    counts: dict[str, int] = {
        str(s): int(n)
        for s, n in conn.execute(sa.select(ops.c.status, sa.func.count()).group_by(ops.c.status))
    }
    reasons = conn.execute(
        sa.select(ops.c.status, ops.c.status_reason, sa.func.count())
        .where(ops.c.status.in_([OperationStatus.BLOCKED.value, OperationStatus.UNKNOWN.value]))
        .group_by(ops.c.status, ops.c.status_reason)
    ).all()
    oldest, now = conn.execute(
        sa.select(sa.func.min(ops.c.created_at), db_now()).where(
            ops.c.status == OperationStatus.PENDING.value
        )
    ).one()
    due_age = store_for(conn.dialect.name).oldest_due_pending_age(conn)
    # A replica is "seen" when it holds a lease now or moved an operation recently (its
    # worker id is the lease owner and the events' actor; the agent's own events are
    # written by "outbox"). An idle replica that moved nothing in the window is not seen.
    seen: dict[str, dict[str, Any]] = {}
    for owner, leases, last in conn.execute(
        sa.select(ops.c.lease_owner, sa.func.count(), sa.func.max(ops.c.updated_at))
        .where(
            ops.c.status.in_([OperationStatus.CLAIMED.value, OperationStatus.DISPATCHING.value]),
            ops.c.lease_owner.isnot(None),
        )
        .group_by(ops.c.lease_owner)
    ):
        seen[owner] = {"worker": owner, "leases": int(leases), "last_seen": last}
    for actor, last in conn.execute(
        sa.select(events.c.actor, sa.func.max(events.c.created_at))
        .where(events.c.created_at >= db_now(-RECENT_SECONDS), events.c.kind == "transition")
        .group_by(events.c.actor)
    ):
        if actor == SYSTEM_ACTOR:
            continue
        entry = seen.setdefault(actor, {"worker": actor, "leases": 0, "last_seen": last})
        if entry["last_seen"] is None or (last is not None and last > entry["last_seen"]):
            entry["last_seen"] = last
    replicas = []
    for entry in sorted(seen.values(), key=lambda e: str(e["worker"])):
        last = entry["last_seen"]
        ago = None if last is None else max(0.0, (now - last).total_seconds())
        replicas.append(
            {"worker": entry["worker"], "leases": entry["leases"], "last_seen_seconds_ago": ago}
        )
    return {
        "operations": {s.value: int(counts.get(s.value, 0)) for s in OperationStatus},
        "oldest_pending_age_seconds": due_age,
        "oldest_pending_created_seconds_ago": (
            max(0.0, (now - oldest).total_seconds()) if oldest else 0.0
        ),
        "unknown_by_reason": {r or "unspecified": n for s, r, n in reasons if s == "unknown"},
        "blocked_by_reason": {r or "unspecified": n for s, r, n in reasons if s == "blocked"},
        "replicas_seen_recently": [r["worker"] for r in replicas],
        "replicas": replicas,
    }


def render(report: dict[str, Any]) -> str:
    lines = ["status        count"]
    for status, n in report["operations"].items():
        lines.append(f"{status:<13} {n:>5}")
    lines.append(
        f"\noldest due pending: waiting {report['oldest_pending_age_seconds']:.1f} s"
        f" (oldest pending created {report['oldest_pending_created_seconds_ago']:.1f} s ago)"
    )
    for title, key in (("unknown", "unknown_by_reason"), ("blocked", "blocked_by_reason")):
        if report[key]:
            lines.append(f"\n{title} by reason:")
            lines.extend(f"  {r:<40} {n:>5}" for r, n in sorted(report[key].items()))
    lines.append(f"\nreplicas seen in the last {RECENT_SECONDS // 60} minutes:")
    if not report["replicas"]:
        lines.append("  none")
    for r in report["replicas"]:
        ago = r["last_seen_seconds_ago"]
        when = "-" if ago is None else f"{ago:.0f} s ago"
        lines.append(f"  {r['worker']:<40} leases {r['leases']:>4}  last seen {when}")
    return "\n".join(lines)
