"""Jobs that run once per cluster at a time, however many replicas schedule them.

Such a job takes its lock as the first statement of its transaction
(``pg_try_advisory_xact_lock``): when another replica holds it, the run does nothing, and
the lock ends with the holder's COMMIT or ROLLBACK, so a replica that dies never leaves it
held. SQLite has one writer at a time anyway: the lock is always had. The keys are here,
in one place, so two jobs can never share one by accident."""

from __future__ import annotations

import enum

from sqlalchemy.engine import Connection

from dispatcher.store import store_for


class ClusterLock(enum.IntEnum):
    LEASE_RECOVERY = 0x6F7574626F780001  # "outbox" + 1
    RETENTION = 0x6F7574626F780002  # "outbox" + 2


def take(conn: Connection, lock: ClusterLock) -> bool:
    """Whether this transaction now holds ``lock`` (False: another replica's run does)."""
    return store_for(conn.dialect.name).take_cluster_lock(conn, int(lock))
