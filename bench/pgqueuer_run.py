"""PgQueuer no-op jobs on the same PostgreSQL, for comparison: one consumer (one
``QueueManager``), a given dequeue batch, its asyncpg or psycopg driver. PgQueuer is
installed into the bench environment by ``make bench`` only; it is never a dependency of
outboxd.

Run as a subprocess: ``python -m bench.pgqueuer_run DSN DRIVER JOBS BATCH`` (DRIVER is
``asyncpg`` or ``psycopg``) prints ``JOBS_PER_S COMMITS_PER_JOB CLIENT_CPU SERVER_CPU
WAL_START WAL_END``, the CPU in µs per job, the write-ahead log's positions in bytes at
the drain's start and end (``bench.wal``). The jobs are enqueued first (then ``ANALYZE``,
as outboxd's backlog is staged), then timed from the consumer's start until drain mode
returns (the queue empty, every job's completion written). Commits
are the transactions that wrote over the drain (``bench.harness.writing_commits``), counted
as for outboxd; the CPU is the consumer process's over the drain and the database's server
processes' (``bench.harness.backend_cpu``), as ``bench.daemon_runs.drain`` counts outboxd's.

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

import psycopg

from bench.harness import REPO, backend_cpu, wal_lsn, writing_commits

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


async def _run(dsn: str, driver: str, jobs: int, batch: int) -> dict[str, float]:
    from pgqueuer import Queries, QueueManager
    from pgqueuer.domain.types import QueueExecutionMode

    conn, drv = await _connect(dsn, driver)
    try:
        queries = Queries(drv)
        await queries.install()
        for start in range(0, jobs, ENQUEUE_CHUNK):
            n = min(ENQUEUE_CHUNK, jobs - start)
            await queries.enqueue(["noop"] * n, [None] * n, [0] * n)
        # as autovacuum would shortly after a bulk load, and as outboxd's backlog is staged
        # (``bench.daemon_runs.fill``): without row estimates PgQueuer's dequeue planned
        # 50,000 queued jobs badly (server CPU 90-95 µs a job against 34-37, half the rate)
        with psycopg.connect(dsn, autocommit=True) as c:
            c.execute("ANALYZE")
        qm = QueueManager(queries)

        @qm.entrypoint("noop")
        async def noop(job: Any) -> None:
            return None

        await asyncio.sleep(STATS_FLUSH_S)
        before = writing_commits(dsn)
        with psycopg.connect(dsn, autocommit=True) as watch:
            server_before = backend_cpu(watch)
            wal_start = wal_lsn(watch)
            cpu_before = time.process_time()
            t0 = time.perf_counter()
            await qm.run(batch_size=batch, mode=QueueExecutionMode.drain,
                         dequeue_timeout=timedelta(seconds=1))
            seconds = time.perf_counter() - t0
            cpu = time.process_time() - cpu_before
            server = sum(v - server_before.get(p, 0.0) for p, v in backend_cpu(watch).items())
            wal_end = wal_lsn(watch)
    finally:
        await conn.close()
    await asyncio.sleep(STATS_FLUSH_S)
    commits = writing_commits(dsn) - before
    return {"rows_per_s": jobs / seconds, "commits_per_op": commits / jobs,
            "cpu_us_per_row": cpu * 1e6 / jobs, "server_cpu_us_per_row": server * 1e6 / jobs,
            "wal_start": wal_start, "wal_end": wal_end}


def run(dsn: str, driver: str, jobs: int, batch: int) -> tuple[float, float]:
    """One drain in a process of its own: (jobs per second, commits per job)."""
    r = figures(dsn, driver, jobs, batch)
    return r["rows_per_s"], r["commits_per_op"]


def figures(dsn: str, driver: str, jobs: int, batch: int) -> dict[str, float]:
    """One drain in a process of its own: jobs per second, commits per job, and the
    consumer's and the server's CPU per job (µs), keyed as ``bench.daemon_runs.drain``
    keys outboxd's."""
    out = subprocess.run(
        [sys.executable, "-m", "bench.pgqueuer_run", dsn, driver, str(jobs), str(batch)],
        cwd=REPO, capture_output=True, text=True, timeout=600, check=False,
    )
    try:
        values = [float(v) for v in out.stdout.split()[-len(FIGURES):]]
        return dict(zip(FIGURES, values, strict=True))
    except ValueError:
        raise RuntimeError(f"pgqueuer run failed: {out.stderr[-800:]}") from None


FIGURES = ("rows_per_s", "commits_per_op", "cpu_us_per_row", "server_cpu_us_per_row",
           "wal_start", "wal_end")
"""What a drain reports; the last two are the write-ahead log's positions in bytes at the
drain's start and end (``bench.wal``)."""


def main() -> int:
    dsn, driver, jobs, batch = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    r = asyncio.run(_run(dsn, driver, jobs, batch))
    print(" ".join(f"{r[k]:.4f}" for k in FIGURES))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
