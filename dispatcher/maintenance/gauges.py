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

Two counts grow with what they count, so each is budgeted: it is repeated only after
``COST_FACTOR`` times its own last duration has passed (at most every ``max_interval``
seconds), so each takes at most ~1% of one connection's time — on every refresh while it
is cheap, less often as it grows. Their series keep the last value in between:

* the terminal statuses (``applied``, ``verified``, ``rejected``, ``cancelled``) grow with
  the table (at most every ``TERMINAL_MAX_INTERVAL_SECONDS``);
* ``pending`` grows with the backlog: at a million pending rows its count reads a million
  index entries (over 100 ms on a small machine), which every five seconds took a share
  of the server from the dispatch it measures (at most every
  ``PENDING_MAX_INTERVAL_SECONDS``). The oldest due pending age, the alert that a backlog
  is stuck, is two index probes and stays fresh on every refresh.

The daemon runs this job only where the gauges are exported (``[metrics] enabled``).
"""

from __future__ import annotations

import time
from collections.abc import Callable

from sqlalchemy.engine import Engine

from dispatcher.observability import metrics
from dispatcher.store import store_for
from outbox import schema
from outbox.states import OperationStatus

ops = schema.operations
S = OperationStatus

NON_TERMINAL = (S.PENDING, S.CLAIMED, S.DISPATCHING, S.UNKNOWN, S.BLOCKED)
TERMINAL = tuple(s for s in OperationStatus if s not in NON_TERMINAL)
#: the statuses counted on every refresh: what is leased or waits on a person
LIVE = tuple(s for s in NON_TERMINAL if s is not S.PENDING)
COST_FACTOR = 100.0
TERMINAL_MAX_INTERVAL_SECONDS = 300.0
PENDING_MAX_INTERVAL_SECONDS = 60.0


class Budget:
    """When a count whose cost grows is due again: after ``COST_FACTOR`` times its last
    duration, never later than ``max_interval`` seconds, always on the first call."""

    def __init__(self, max_interval: float) -> None:
        self.max_interval = max_interval
        self._at: float | None = None
        self._cost = 0.0

    def due(self, now: float) -> bool:
        wait = min(self.max_interval, self._cost * COST_FACTOR)
        return self._at is None or now - self._at >= wait

    def spent(self, started: float, ended: float) -> None:
        self._at, self._cost = started, ended - started


#: Reasons that currently have a ``outbox_blocked_operations`` series (the gauge is global).
_blocked_reasons: set[str] = set()


class GaugeRefresher:
    """The scheduler job: ``refresher()`` reads the database, sets the gauges and returns
    the counts it read (a budgeted count not due is left out, its series unchanged)."""

    def __init__(self, engine: Engine, clock: Callable[[], float] = time.monotonic) -> None:
        self.engine = engine
        self.clock = clock
        self.budgets = ((Budget(PENDING_MAX_INTERVAL_SECONDS), (S.PENDING,)),
                        (Budget(TERMINAL_MAX_INTERVAL_SECONDS), TERMINAL))

    def __call__(self) -> dict[str, int]:
        store = store_for(self.engine.dialect.name)
        with self.engine.connect() as conn:
            counts = store.count_by_status(conn, LIVE)
            for budget, statuses in self.budgets:
                started = self.clock()
                if budget.due(started):
                    counts.update(store.count_by_status(conn, statuses))
                    budget.spent(started, self.clock())
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
