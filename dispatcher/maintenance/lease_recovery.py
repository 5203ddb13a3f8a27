"""Lease recovery: the periodic job that returns rows whose worker vanished.

An expired lease in ``claimed`` means the row was never sent: back to ``pending``. An
expired lease in ``dispatching`` means it may have been sent: ``unknown``, never
``pending`` — reconciliation decides. Also applies task cancellations made with plain
SQL. One replica of the cluster runs it at a time (:mod:`.cluster_lock`); the statements
are conditional anyway.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from sqlalchemy.engine import Engine

from dispatcher.maintenance import cluster_lock
from dispatcher.maintenance.cluster_lock import ClusterLock
from dispatcher.observability import metrics
from dispatcher.store import journal, store_for
from outbox.api import sweep_cancelled
from outbox.states import OperationStatus

log = logging.getLogger("outboxd.recovery")
DEFAULT_LIMIT = 1000


@dataclass(frozen=True)
class RecoveryCounts:
    returned_to_pending: int = 0
    made_unknown: int = 0
    cancelled: int = 0


class LeaseRecovery:
    def __init__(self, engine: Engine, *, actor: str, limit: int = DEFAULT_LIMIT) -> None:
        self.engine = engine
        self.actor = actor
        self.limit = limit

    def run_once(self) -> RecoveryCounts:
        with self.engine.begin() as conn:
            if not cluster_lock.take(conn, ClusterLock.LEASE_RECOVERY):
                return RecoveryCounts()
            store = store_for(conn.dialect.name)
            expired = store.expired_leases(conn, limit=self.limit)
            moved = store.recover_leases(conn, expired) if expired else []
            events, attempts = [], []
            before = {r.id: r for r in expired}
            for row in moved:
                old = before[row.id]
                events.append(
                    journal.event(
                        row,
                        from_status=old.status.value,
                        to_status=row.status.value,
                        actor=self.actor,
                        reason="lease_expired",
                        fencing_token=old.fencing_token,
                    )
                )
                if row.status == OperationStatus.UNKNOWN:
                    attempts.append(
                        journal.attempt(
                            row,
                            attempt_no=row.attempts,
                            token=old.fencing_token or 0,
                            worker=old.lease_owner or "",
                            result_class="lost",
                            started_at=old.last_attempt_started_at,
                            finished_at=None,
                            evidence={
                                "lease_owner": old.lease_owner,
                                "lease_expires_at": str(old.lease_expires_at),
                            },
                        )
                    )
            journal.write(conn, events, attempts)
            swept = sweep_cancelled(conn, actor=self.actor)
        pending = sum(1 for r in moved if r.status == OperationStatus.PENDING)
        unknown = len(moved) - pending
        if pending:
            metrics.LEASE_EXPIRATIONS.labels("claimed").inc(pending)
        if unknown:
            metrics.LEASE_EXPIRATIONS.labels("dispatching").inc(unknown)
        counts = RecoveryCounts(pending, unknown, len(swept.cancelled))
        if moved or swept.cancelled:
            log.info(
                "lease recovery",
                extra={
                    "returned_to_pending": pending,
                    "made_unknown": unknown,
                    "cancelled": len(swept.cancelled),
                },
            )
        return counts
