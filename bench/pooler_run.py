"""Throughput through PgBouncer's transaction pooling, as a ratio to the same drain direct.

The pooler is Debian's PgBouncer, started as a process of its own on a free port
(:class:`tests.support.pgbouncer.PgBouncer`) in front of the bench's PostgreSQL; the
replicas run with ``[database] pooler = "transaction"`` (no prepared statements, LISTEN off,
polling). Direct and pooled runs alternate, each on a fresh database.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from bench import daemon_runs as d
from bench import harness as h
from tests.support.pgbouncer import PgBouncer, binary


def pooled_vs_direct(runs: int, rows: int, *, replicas: int = 2,
                     batch: int = 100, pool_size: int = 20) -> tuple[h.Figure, h.Figure] | None:
    if binary() is None:
        h.log("  pgbouncer not installed (Debian package pgbouncer): skipped")
        return None
    direct = h.Figure(f"direct, {replicas} replicas, batch {batch}", "rows/s")
    pooled = h.Figure(f"PgBouncer transaction pooling, {replicas} replicas, batch {batch}",
                      "rows/s", note=f"default_pool_size {pool_size}")
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(runs):
            for figure, through_pooler in ((direct, False), (pooled, True)):
                with h.scratch_database() as dsn:
                    d.prepare(dsn)
                    d.fill(dsn, rows)
                    if not through_pooler:
                        r = d.drain(dsn, rows, batch=batch, replicas=replicas)
                    else:
                        with PgBouncer(Path(tmp), upstream=dsn, mode="transaction",
                                       pool_size=pool_size) as bouncer:
                            via = bouncer.dsn(dsn.rsplit("/", 1)[1])
                            r = d.drain(dsn, rows, batch=batch, replicas=replicas, via=via,
                                        database='pooler = "transaction"')
                    figure.samples.append(r["rows_per_s"])
    return direct, pooled
