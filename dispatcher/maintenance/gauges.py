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

from sqlalchemy.engine import Engine

from dispatcher.observability import metrics
from dispatcher.store import store_for
from outbox import schema
from outbox.states import OperationStatus

ops = schema.operations
S = OperationStatus

NON_TERMINAL = (S.PENDING, S.CLAIMED, S.DISPATCHING, S.UNKNOWN, S.BLOCKED)
TERMINAL = tuple(s for s in OperationStatus if s not in NON_TERMINAL)
TERMINAL_COST_FACTOR = 100.0
TERMINAL_MAX_INTERVAL_SECONDS = 300.0

#: Reasons that currently have a ``outbox_blocked_operations`` series (the gauge is global).
_blocked_reasons: set[str] = set()


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
        store = store_for(self.engine.dialect.name)
        with self.engine.connect() as conn:
            counts = store.count_by_status(conn, NON_TERMINAL)
            if terminal_due:
                t0 = time.monotonic()
                counts.update(store.count_by_status(conn, TERMINAL))
                self._terminal_cost = time.monotonic() - t0
                self._terminal_at = now
            reasons = store.blocked_by_reason(conn)
            oldest = store.oldest_due_pending_age(conn)
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
