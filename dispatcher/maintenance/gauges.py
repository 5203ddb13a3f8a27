"""Gauges read from the database (right after a restart), refreshed by a scheduler job.

Every query is an index range scan bounded by what is *live*, never by the table's size
(checked with ``EXPLAIN`` on PostgreSQL in ``tests/observability/test_gauges.py``):

* counts of the non-terminal statuses (``pending``, ``claimed``, ``dispatching``,
  ``unknown``, ``blocked``): ``status IN (...)`` on the ``(status, updated_at)`` index, an
  index-only scan of the backlog;
* ``blocked`` by reason: the same index, ``status = 'blocked'``;
* the oldest due pending operation: two probes of the partial pending index
  ``(next_attempt_at, id) WHERE status = 'pending'`` — the smallest ``next_attempt_at``
  (a retry waiting for its time) and the first row with none (never tried, in insertion
  order) — one index entry each.

The terminal statuses (``applied``, ``verified``, ``rejected``, ``cancelled``) grow with
the table, so counting them scans their part of the index. That count is budgeted: it is
repeated only after ``TERMINAL_COST_FACTOR`` times its own last duration has passed (at
most every ``TERMINAL_MAX_INTERVAL_SECONDS``), so it takes at most ~1% of one connection's
time — on every refresh for a small table, once every few minutes for a huge one. Their
series keep the last value in between.
"""

from __future__ import annotations

import time
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from dispatcher.observability import metrics
from outbox import schema
from outbox.states import OperationStatus
from outbox.types import db_now

ops = schema.operations
S = OperationStatus

NON_TERMINAL = (S.PENDING, S.CLAIMED, S.DISPATCHING, S.UNKNOWN, S.BLOCKED)
TERMINAL = tuple(s for s in OperationStatus if s not in NON_TERMINAL)
TERMINAL_COST_FACTOR = 100.0
TERMINAL_MAX_INTERVAL_SECONDS = 300.0

#: Reasons that currently have a ``outbox_blocked_operations`` series (the gauge is global).
_blocked_reasons: set[str] = set()


def count_statement(statuses: tuple[OperationStatus, ...]) -> sa.Select[Any]:
    return (
        sa.select(ops.c.status, sa.func.count())
        .where(ops.c.status.in_([s.value for s in statuses]))
        .group_by(ops.c.status)
    )


def blocked_statement() -> sa.Select[Any]:
    return (
        sa.select(ops.c.status_reason, sa.func.count())
        .where(ops.c.status == S.BLOCKED.value)
        .group_by(ops.c.status_reason)
    )


def count_by_status(conn: Connection, statuses: tuple[OperationStatus, ...]) -> dict[str, int]:
    rows = conn.execute(count_statement(statuses)).all()
    found = {str(status): int(n) for status, n in rows}
    return {s.value: found.get(s.value, 0) for s in statuses}


def blocked_by_reason(conn: Connection) -> dict[str, int]:
    rows = conn.execute(blocked_statement()).all()
    return {str(reason or "unspecified"): int(n) for reason, n in rows}


def oldest_due_pending_statement() -> sa.Select[Any]:
    pending = ops.c.status == S.PENDING.value
    next_retry = (
        sa.select(ops.c.next_attempt_at)
        .where(pending, ops.c.next_attempt_at.isnot(None))
        .order_by(ops.c.next_attempt_at, ops.c.id)
        .limit(1)
        .scalar_subquery()
    )
    first_new = (
        sa.select(ops.c.created_at)
        .where(pending, ops.c.next_attempt_at.is_(None))
        .order_by(ops.c.next_attempt_at, ops.c.id)
        .limit(1)
        .scalar_subquery()
    )
    return sa.select(next_retry, first_new, db_now())


def oldest_due_pending_age(conn: Connection) -> float:
    """Seconds the longest-waiting *due* pending operation has waited since it became due
    (its ``next_attempt_at``, or its creation when it has none); 0 when none is due."""
    next_retry, first_new, now = conn.execute(oldest_due_pending_statement()).one()
    due_since: list[datetime] = [t for t in (next_retry, first_new) if t is not None]
    if not due_since:
        return 0.0
    return max(0.0, float((now - min(due_since)).total_seconds()))


class GaugeRefresher:
    """The scheduler job: ``refresher()`` reads the database and sets the gauges."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._terminal_at: float | None = None
        self._terminal_cost = 0.0

    def __call__(self) -> dict[str, int]:
        now = time.monotonic()
        wait = min(TERMINAL_MAX_INTERVAL_SECONDS, self._terminal_cost * TERMINAL_COST_FACTOR)
        terminal_due = self._terminal_at is None or now - self._terminal_at >= wait
        with self.engine.connect() as conn:
            counts = count_by_status(conn, NON_TERMINAL)
            if terminal_due:
                t0 = time.monotonic()
                counts.update(count_by_status(conn, TERMINAL))
                self._terminal_cost = time.monotonic() - t0
                self._terminal_at = now
            reasons = blocked_by_reason(conn)
            oldest = oldest_due_pending_age(conn)
        for status, n in counts.items():
            metrics.OPERATIONS.labels(status).set(n)
        metrics.UNKNOWN_OPERATIONS.set(counts[S.UNKNOWN.value])
        for gone in _blocked_reasons - reasons.keys():  # no clear(): no gap for a scrape
            metrics.BLOCKED_OPERATIONS.remove(gone)
        for reason, n in reasons.items():
            metrics.BLOCKED_OPERATIONS.labels(reason).set(n)
        _blocked_reasons.clear()
        _blocked_reasons.update(reasons)
        metrics.OLDEST_PENDING_AGE.set(oldest)
        metrics.GAUGES_REFRESHED.set_to_current_time()
        return counts


def refresh(engine: Engine) -> dict[str, int]:
    """One full refresh, terminal counts included."""
    return GaugeRefresher(engine)()
