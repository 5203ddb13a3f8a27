"""Gauges read from the database (right after a restart), refreshed by a scheduler job.

Queries: one ``GROUP BY status`` (served by the ``(status, updated_at)`` index), one
``GROUP BY status_reason`` over blocked rows only, and the oldest due pending row through
the partial pending index — never a scan per scrape.
"""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from dispatcher import metrics
from outbox import schema
from outbox.states import OperationStatus
from outbox.types import db_now

ops = schema.operations


def refresh(engine: Engine) -> dict[str, int]:
    with engine.connect() as conn:
        by_status: dict[str, int] = dict(
            conn.execute(sa.select(ops.c.status, sa.func.count()).group_by(ops.c.status))
            .tuples()
            .all()
        )
        blocked = conn.execute(
            sa.select(ops.c.status_reason, sa.func.count())
            .where(ops.c.status == OperationStatus.BLOCKED.value)
            .group_by(ops.c.status_reason)
        ).all()
        oldest = conn.execute(
            sa.select(sa.func.min(ops.c.created_at), db_now()).where(
                ops.c.status == OperationStatus.PENDING.value
            )
        ).one()
    for status in OperationStatus:
        metrics.OPERATIONS.labels(status.value).set(by_status.get(status.value, 0))
    metrics.UNKNOWN_OPERATIONS.set(by_status.get(OperationStatus.UNKNOWN.value, 0))
    metrics.BLOCKED_OPERATIONS.clear()
    for reason, n in blocked:
        metrics.BLOCKED_OPERATIONS.labels(reason or "unspecified").set(n)
    first, now = oldest
    metrics.OLDEST_PENDING_AGE.set(max(0.0, (now - first).total_seconds()) if first else 0.0)
    return {str(k): int(v) for k, v in by_status.items()}
