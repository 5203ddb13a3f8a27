"""PgQueuer no-op jobs on the same PostgreSQL, for comparison: one consumer (one
``QueueManager``), a given dequeue batch, its asyncpg or psycopg driver. PgQueuer is
installed into the bench environment by ``make bench`` only; it is never a dependency of
outboxd.

Run as a subprocess: ``python -m bench.pgqueuer_run DSN DRIVER JOBS BATCH`` (DRIVER is
``asyncpg`` or ``psycopg``) prints ``JOBS_PER_S COMMITS_PER_JOB``. The jobs are enqueued
first, then timed from the consumer's start until drain mode returns (the queue empty,
every job's completion written). Commits are the transactions that wrote over the drain
(``bench.harness.writing_commits``), counted as for outboxd.

Its psycopg driver shares one connection between its NOTIFY watcher
(``notifies(timeout=1.0)``) and its queries, and psycopg 3.2+ locks the connection for
the whole of a ``notifies()`` call, so each of its queries can wait for a notification or
that second; with psycopg 3.3 that driver drains far slower than the asyncpg one. The
target is against asyncpg; the psycopg figure is reported as measured.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from datetime import timedelta
from typing import Any

from bench.harness import REPO, writing_commits

ENQUEUE_CHUNK = 1_000
STATS_FLUSH_S = 1.2
"""PostgreSQL 15 flushes a backend's statistics at most once a second."""


async def _connect(dsn: str, driver: str) -> tuple[Any, Any]:
    from pgqueuer.db import AsyncpgDriver, PsycopgDriver

    if driver == "asyncpg":
        import asyncpg

        conn = await asyncpg.connect(dsn)
        return conn, AsyncpgDriver(conn)
    if driver == "psycopg":
        import psycopg

        aconn = await psycopg.AsyncConnection.connect(dsn, autocommit=True)
        return aconn, PsycopgDriver(aconn)
    raise SystemExit(f"driver must be asyncpg or psycopg, not {driver!r}")


async def _run(dsn: str, driver: str, jobs: int, batch: int) -> tuple[float, float]:
    from pgqueuer import Queries, QueueManager
    from pgqueuer.domain.types import QueueExecutionMode

    conn, drv = await _connect(dsn, driver)
    try:
        queries = Queries(drv)
        await queries.install()
        for start in range(0, jobs, ENQUEUE_CHUNK):
            n = min(ENQUEUE_CHUNK, jobs - start)
            await queries.enqueue(["noop"] * n, [None] * n, [0] * n)
        qm = QueueManager(queries)

        @qm.entrypoint("noop")
        async def noop(job: Any) -> None:
            return None

        await asyncio.sleep(STATS_FLUSH_S)
        before = writing_commits(dsn)
        t0 = time.perf_counter()
        await qm.run(batch_size=batch, mode=QueueExecutionMode.drain,
                     dequeue_timeout=timedelta(seconds=1))
        seconds = time.perf_counter() - t0
    finally:
        await conn.close()
    await asyncio.sleep(STATS_FLUSH_S)
    commits = writing_commits(dsn) - before
    return jobs / seconds, commits / jobs


def run(dsn: str, driver: str, jobs: int, batch: int) -> tuple[float, float]:
    """One drain in a process of its own: (jobs per second, commits per job)."""
    out = subprocess.run(
        [sys.executable, "-m", "bench.pgqueuer_run", dsn, driver, str(jobs), str(batch)],
        cwd=REPO, capture_output=True, text=True, timeout=600, check=False,
    )
    try:
        rate, commits = out.stdout.split()[-2:]
        return float(rate), float(commits)
    except ValueError:
        raise RuntimeError(f"pgqueuer run failed: {out.stderr[-800:]}") from None


def main() -> int:
    dsn, driver, jobs, batch = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    rate, commits = asyncio.run(_run(dsn, driver, jobs, batch))
    print(f"{rate:.1f} {commits:.4f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
