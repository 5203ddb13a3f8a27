"""The retention job: the store's purge (:mod:`dispatcher.store.retention`) on APScheduler,
once per cluster.

Each run is one transaction, and one replica's at a time however many run the job: it
first takes its cluster lock (:mod:`.cluster_lock`) and does nothing while another
replica holds it. The daemon adds the job only when ``[retention] enabled = true``;
``outboxd purge`` runs the same code once.

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

from sqlalchemy.engine import Engine

from dispatcher.config import RetentionConfig
from dispatcher.maintenance import cluster_lock
from dispatcher.maintenance.cluster_lock import ClusterLock
from dispatcher.store import store_for
from dispatcher.store.retention import ACTOR, PurgeCounts

log = logging.getLogger("outboxd.retention")


class RetentionJob:
    def __init__(self, engine: Engine, config: RetentionConfig, *, actor: str = ACTOR) -> None:
        self.engine = engine
        self.config = config
        self.actor = actor

    def run_once(self, *, dry_run: bool = False, now: datetime | None = None) -> PurgeCounts | None:
        """One purge; None when another replica's purge holds the cluster lock."""
        with self.engine.begin() as conn:
            if not cluster_lock.take(conn, ClusterLock.RETENTION):
                log.info("retention purge skipped: another replica is purging")
                return None
            counts = store_for(conn.dialect.name).purge(
                conn, self.config, now=now, dry_run=dry_run, actor=self.actor)
        changed = {k: v for k, v in counts.as_dict().items() if v and k != "dry_run"}
        if changed or dry_run:
            # counts only: never a payload, tenant or operation identifier
            log.info("retention purge%s: %s", " (dry run)" if dry_run else "",
                     json.dumps(changed, sort_keys=True))
        return counts
