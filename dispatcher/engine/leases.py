"""The worker's side of its leases: keeping the leases of rows it is sending alive, and
the rule that no request leaves once a lease may have passed.

A lease is set (``dispatching``) or extended by a statement on the database clock; the
worker notes its own monotonic clock *before* each such statement, so its reckoning of
when the lease ends is never later than the database's. Once that instant has passed,
another replica may have recovered the row to ``unknown`` and be about to count a
not-found look-up as "not applied" (``dispatcher.maintenance.reconcile``); a request leaving after
that could land after the conclusion. So a send that finds its lease spent renews it
first — one fenced statement, which succeeds only while the row is still ``dispatching``
under this worker's token and revision — and is not made when that fails.
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict
from collections.abc import Iterable

from sqlalchemy.engine import Engine

from dispatcher.engine.recording import InFlight
from dispatcher.engine.settings import WorkerSettings
from dispatcher.store import store_for

log = logging.getLogger("outboxd.dispatch")


def extend(engine: Engine, items: Iterable[InFlight], s: WorkerSettings) -> None:
    """Renew the leases of unsent or unanswered sends that outlive a third of their lease
    (one statement per fencing token, one transaction)."""
    due_after = s.lease_seconds / 3
    now = time.monotonic()
    groups: dict[int, list[InFlight]] = defaultdict(list)
    for item in items:
        if item.outcome is None and now - item.extended_at >= due_after:
            groups[item.token].append(item)
    if not groups:
        return
    extended: set[int] = set()
    store = store_for(engine.dialect.name)
    with engine.begin() as conn:
        for token, group in groups.items():
            extended |= store.extend_leases(
                conn,
                token=token,
                pairs=[(i.op.id, i.revision) for i in group],
                lease_seconds=s.lease_seconds,
            )
    until = now + s.lease_send_seconds  # ``now`` was read before the statement
    for group in groups.values():
        for item in group:
            item.extended_at = now
            if item.op.id in extended:  # a row moved on by another actor keeps its end
                item.lease_until = until


def renew_before_send(engine: Engine, item: InFlight, s: WorkerSettings) -> bool:
    """The lease of ``item`` is spent and its request has not left: renew it if the row is
    still this worker's. False — the request must not be sent — when another actor moved
    the row on or the database cannot say."""
    now = time.monotonic()
    try:
        with engine.begin() as conn:
            ours = bool(store_for(engine.dialect.name).extend_leases(
                conn, token=item.token, pairs=[(item.op.id, item.revision)],
                lease_seconds=s.lease_seconds,
            ))
    except Exception:  # unreachable database: the row may be another replica's by now
        log.warning("lease renewal before a send failed", exc_info=True,
                    extra={"operation_id": item.op.operation_id, "fencing_token": item.token})
        return False
    if ours:
        item.extended_at = now
        item.lease_until = now + s.lease_send_seconds
    return ours
