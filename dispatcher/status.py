"""``outboxd status``: counts by status, oldest pending age, unknown and blocked by
reason, replicas seen recently (lease owners), as a table or JSON."""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa

from dispatcher.config import Config
from outbox import db, schema
from outbox.states import OperationStatus
from outbox.types import db_now

ops, events = schema.operations, schema.events
RECENT_SECONDS = 300


def collect(cfg: Config) -> dict[str, Any]:
    engine = db.create_engine(cfg.database.url, schema=cfg.database.schema)
    try:
        with engine.connect() as conn:
            counts: dict[str, int] = dict(
                conn.execute(sa.select(ops.c.status, sa.func.count()).group_by(ops.c.status))
                .tuples()
                .all()
            )
            reasons = conn.execute(
                sa.select(ops.c.status, ops.c.status_reason, sa.func.count())
                .where(
                    ops.c.status.in_([OperationStatus.BLOCKED.value, OperationStatus.UNKNOWN.value])
                )
                .group_by(ops.c.status, ops.c.status_reason)
            ).all()
            oldest, now = conn.execute(
                sa.select(sa.func.min(ops.c.created_at), db_now()).where(
                    ops.c.status == OperationStatus.PENDING.value
                )
            ).one()
            replicas = conn.execute(
                sa.select(events.c.actor, sa.func.max(events.c.created_at))
                .where(
                    events.c.created_at >= db_now(-RECENT_SECONDS), events.c.kind == "transition"
                )
                .group_by(events.c.actor)
            ).all()
    finally:
        engine.dispose()
    return {
        "operations": {s.value: int(counts.get(s.value, 0)) for s in OperationStatus},
        "oldest_pending_age_seconds": (now - oldest).total_seconds() if oldest else 0.0,
        "unknown_by_reason": {r or "unspecified": n for s, r, n in reasons if s == "unknown"},
        "blocked_by_reason": {r or "unspecified": n for s, r, n in reasons if s == "blocked"},
        "replicas_seen_recently": sorted(a for a, _ in replicas if a != "outbox"),
    }


def render(report: dict[str, Any]) -> str:
    lines = ["status        count"]
    for status, n in report["operations"].items():
        lines.append(f"{status:<13} {n:>5}")
    lines.append(f"\noldest pending: {report['oldest_pending_age_seconds']:.1f} s")
    for title, key in (("unknown", "unknown_by_reason"), ("blocked", "blocked_by_reason")):
        if report[key]:
            lines.append(f"\n{title} by reason:")
            lines.extend(f"  {r:<40} {n:>5}" for r, n in sorted(report[key].items()))
    lines.append(
        "\nreplicas seen in the last 5 minutes: "
        + (", ".join(report["replicas_seen_recently"]) or "none")
    )
    return "\n".join(lines)
