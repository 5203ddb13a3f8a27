"""Throughput through PgBouncer's transaction pooling, as a ratio to the same drain direct.

The pooler is Debian's PgBouncer, started as a process of its own on a free port
(:class:`tests.support.pgbouncer.PgBouncer`) in front of the bench's PostgreSQL; the
replicas run with ``[database] pooler = "transaction"`` (no prepared statements, LISTEN off,
polling). Each run is a pair, a direct drain and a pooled one back to back (which goes
first alternates), each on a fresh database; the ratio reported is the median of the
pairs' ratios. On a 2-core machine the speed of whole drains drifts by a third from one
minute to the next (other work on the host, the page cache), far more than the pooler
costs; a pair's two drains see the same drift, so their ratio does not.
"""

from __future__ import annotations

import statistics
import tempfile
from pathlib import Path

from bench import daemon_runs as d
from bench import harness as h
from tests.support.pgbouncer import PgBouncer, binary


def pooled_vs_direct(
    runs: int, rows: int, *, replicas: int = 2, batch: int = 100, pool_size: int = 20
) -> tuple[h.Figure, h.Figure, h.Figure] | None:
    """(direct rows/s, pooled rows/s, pooled / direct per pair)."""
    if binary() is None:
        h.log("  pgbouncer not installed (Debian package pgbouncer): skipped")
        return None
    direct = h.Figure(f"direct, {replicas} replicas, batch {batch}", "rows/s")
    pooled = h.Figure(f"PgBouncer transaction pooling, {replicas} replicas, batch {batch}",
                      "rows/s", note=f"default_pool_size {pool_size}")
    ratio = h.Figure(f"pooled / direct, {replicas} replicas, per pair", "x")
    with tempfile.TemporaryDirectory() as tmp:
        for run in range(runs):
            order = (False, True) if run % 2 == 0 else (True, False)
            rates: dict[bool, float] = {}
            for through_pooler in order:
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
                rates[through_pooler] = r["rows_per_s"]
            direct.samples.append(rates[False])
            pooled.samples.append(rates[True])
            ratio.samples.append(rates[True] / rates[False])
            h.log(f"  pair {run + 1}/{runs}: direct {rates[False]:,.0f}, pooled "
                  f"{rates[True]:,.0f} rows/s, ratio {ratio.samples[-1]:.2f}")
    ratio.note = f"median of {runs} pairs, spread {statistics.pstdev(ratio.samples):.2f} sd"
    return direct, pooled, ratio
