"""The retention job: :func:`outbox.retention.purge` on APScheduler, once per cluster.

Each run is one transaction. On PostgreSQL it first takes a transaction-level advisory
lock (``pg_try_advisory_xact_lock``): when another replica holds it, this run does
nothing and the lock is released by that replica's COMMIT, so however many replicas run
the job, one purge runs at a time. SQLite has a single writer anyway. The daemon adds the
job only when ``[retention] enabled = true``; ``outboxd purge`` runs the same code once.

Privileges (PostgreSQL): the purge needs the retention role. A daemon running as a login
granted only the dispatcher role fails each run with SQLSTATE 42501 (logged, nothing
changed, dispatch unaffected). Either grant the daemon's login both roles, or leave
``enabled = false`` and schedule ``outboxd purge`` as a retention login (cron, a
Kubernetes CronJob). See docs/security-model.md.
"""

from __future__ import annotations

import json
import logging
from datetime import datetime

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from dispatcher.config import RetentionConfig
from outbox.retention import ACTOR, PurgeCounts, purge

log = logging.getLogger("outboxd.retention")
ADVISORY_KEY = 0x6F7574626F780002  # "outbox" + 2 (lease recovery uses + 1)


class RetentionJob:
    def __init__(self, engine: Engine, config: RetentionConfig, *, actor: str = ACTOR) -> None:
        self.engine = engine
        self.config = config
        self.actor = actor

    def run_once(self, *, dry_run: bool = False, now: datetime | None = None) -> PurgeCounts | None:
        """One purge; None when another replica's purge holds the cluster lock."""
        with self.engine.begin() as conn:
            if conn.dialect.name == "postgresql":
                got = conn.execute(
                    sa.select(sa.func.pg_try_advisory_xact_lock(ADVISORY_KEY))
                ).scalar()
                if not got:
                    log.info("retention purge skipped: another replica is purging")
                    return None
            counts = purge(conn, self.config, now=now, dry_run=dry_run, actor=self.actor)
        changed = {k: v for k, v in counts.as_dict().items() if v and k != "dry_run"}
        if changed or dry_run:
            # counts only: never a payload, tenant or operation identifier
            log.info("retention purge%s: %s", " (dry run)" if dry_run else "",
                     json.dumps(changed, sort_keys=True))
        return counts
