"""outboxd measured as users run it: real ``outboxd run`` processes draining a backlog."""

from __future__ import annotations

import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psycopg

from bench.harness import (
    REPO,
    Deadline,
    backend_cpu,
    cpu_seconds,
    log,
    peak_rss_mb,
    sa_url,
    scratch_database,
    writing_commits,
)
from outbox import db, migrate


def prepare(dsn: str) -> None:
    engine = db.create_engine(sa_url(dsn))
    migrate.upgrade(engine)
    engine.dispose()


def fill(dsn: str, rows: int, provider: str = "sink", start: int = 0) -> None:
    """Stage ``rows`` operations with plain SQL (the path agents in any language use)."""
    with psycopg.connect(dsn) as conn:
        conn.execute(
            "INSERT INTO outbox_operations (tenant_id, task_id, operation_id, provider, payload) "
            "SELECT 'bench', 'task-' || (g / 100), 'op:' || g, %s, "
            "jsonb_build_object('n', g, 'text', 'benchmark payload') "
            "FROM generate_series(%s::bigint, %s::bigint) g",
            (provider, start + 1, start + rows),
        )
        conn.commit()
        # as autovacuum would shortly after a bulk load: the claim's plan needs row estimates
        conn.execute("ANALYZE outbox_operations")
        conn.commit()


def settle(dsn: str) -> None:
    """Let maintenance catch up with a bulk load before a drain is timed: ``VACUUM
    (ANALYZE)`` (what autovacuum starts within a minute of a million inserts) and a
    ``CHECKPOINT`` (the load's WAL). Without it the backlog section timed the load's
    aftermath — a checkpoint of the load's pages spread over the drain window, an
    autovacuum of the whole table landing in it or not — rather than the backlog."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("VACUUM (ANALYZE) outbox_operations")
        conn.execute("CHECKPOINT")


def write_config(directory: Path, dsn: str, *, batch: int, provider: str,
                 database: str = "", extra: str = "") -> Path:
    path = directory / "bench.toml"
    path.write_text(f"""
[database]
url = "{sa_url(dsn)}"
{database}
[dispatcher]
batch_size = {batch}
concurrency = {max(32, batch)}
poll_interval_ms = 20
reconcile_interval_seconds = 5
recovery_interval_seconds = 5
log_level = "WARNING"
[metrics]
enabled = false
{extra}
{provider}
""")
    return path


NULL_PROVIDER = '[providers.sink]\nkind = "null"\n'


def drain_seconds(conn: psycopg.Connection[Any]) -> float:
    """First claim to last applied, on the database clock (NaN if nothing was claimed)."""
    span = conn.execute(
        "SELECT extract(epoch FROM (SELECT max(updated_at) FROM outbox_operations)"
        " - (SELECT min(created_at) FROM outbox_events WHERE to_status = 'claimed'))"
    ).fetchone()
    return float(span[0]) if span and span[0] else float("nan")


def drain(
    dsn: str,
    rows: int,
    *,
    batch: int,
    replicas: int = 1,
    provider: str = NULL_PROVIDER,
    timeout: float = 300,
    via: str | None = None,
    database: str = "",
    extra: str = "",
) -> dict[str, float]:
    """Start ``replicas`` daemons on a filled backlog and wait until it is applied.
    Returns rows/s (first claim to last applied, on the database clock), commits per op,
    the peak RSS of the first replica, and CPU time per row applied from the first poll
    that saw a row applied to the last: the first replica's, and the database's server
    processes' (:func:`bench.harness.backend_cpu`). ``via``: the DSN the daemons use (a pooler in
    front of ``dsn``), with ``database`` added to their ``[database]`` table."""
    with tempfile.TemporaryDirectory() as tmp:
        cfg = write_config(Path(tmp), via or dsn, batch=batch, provider=provider,
                           database=database, extra=extra)
        commits_before = writing_commits(dsn)
        procs = [
            subprocess.Popen(
                [sys.executable, "-m", "dispatcher.cli", "run", "--config", str(cfg)],
                cwd=REPO,
                stderr=subprocess.DEVNULL,
            )
            for _ in range(replicas)
        ]
        rss = 0.0
        deadline = Deadline(timeout)
        first: tuple[float, int] | None = None  # CPU seconds, rows applied at the first poll
        cpu = float("nan")  # that saw rows applied: the import and start-up left out
        server_first: dict[int, float] = {}  # the server's, per process, at that poll
        server = float("nan")
        try:
            with psycopg.connect(dsn, autocommit=True) as conn:
                while not deadline.passed():
                    time.sleep(0.25)
                    rss = max(rss, peak_rss_mb(procs[0].pid))
                    used = cpu_seconds(procs[0].pid)
                    row = conn.execute(
                        "SELECT count(*) FILTER (WHERE status = 'applied'), "
                        "count(*) FROM outbox_operations"
                    ).fetchone()
                    assert row is not None
                    serving = backend_cpu(conn)
                    if first is None and row[0]:
                        first = (used, int(row[0]))
                        server_first = serving
                    if row[0] >= row[1]:
                        if first is not None and row[0] > first[1]:
                            applied = int(row[0]) - first[1]
                            cpu = (used - first[0]) / applied
                            # a process that connected after that poll counts from zero
                            server = sum(s - server_first.get(p, 0.0)
                                         for p, s in serving.items()) / applied
                        break
                else:
                    log(f"  drain timed out: {row[0]} of {row[1]} applied")
                seconds = drain_seconds(conn)
        finally:
            for p in procs:
                p.terminate()
            for p in procs:
                p.wait(timeout=30)
        commits = writing_commits(dsn) - commits_before
    return {"rows_per_s": rows / seconds, "commits_per_op": commits / rows, "rss_mb": rss,
            "cpu_us_per_row": cpu * 1e6, "server_cpu_us_per_row": server * 1e6}


def drain_for(
    dsn: str,
    seconds: float,
    *,
    batch: int,
    provider: str = NULL_PROVIDER,
    rss: list[float] | None = None,
) -> float:
    """Applied rows per second of one replica over ``seconds`` of a (large) backlog, first
    claim to last applied on the database clock; its peak RSS (MB) is appended to ``rss``
    when given."""
    with tempfile.TemporaryDirectory() as tmp:
        cfg = write_config(Path(tmp), dsn, batch=batch, provider=provider)
        proc = subprocess.Popen(
            [sys.executable, "-m", "dispatcher.cli", "run", "--config", str(cfg)],
            cwd=REPO,
            stderr=subprocess.DEVNULL,
        )
        try:
            with psycopg.connect(dsn, autocommit=True) as conn:

                def applied() -> int:
                    row = conn.execute(
                        "SELECT count(*) FROM outbox_operations WHERE status = 'applied'"
                    ).fetchone()
                    assert row is not None
                    return int(row[0])

                row = conn.execute("SELECT count(*) FROM outbox_operations").fetchone()
                assert row is not None
                total = int(row[0])
                deadline = Deadline(30)
                while applied() == 0 and not deadline.passed():
                    time.sleep(0.05)
                window = Deadline(seconds)
                while not window.passed():  # until the window ends or the backlog is drained
                    time.sleep(0.1)
                    if applied() >= total:
                        break
                # on the database clock, first claim to last applied (one snapshot): a
                # 10,000-row backlog drains in about a second, a tenth of it in polling
                done = conn.execute(
                    "SELECT count(*), extract(epoch FROM max(updated_at) - (SELECT"
                    " min(created_at) FROM outbox_events WHERE to_status = 'claimed'))"
                    " FROM outbox_operations WHERE status = 'applied'"
                ).fetchone()
                assert done is not None and done[1]
                rate = int(done[0]) / float(done[1])
                if rss is not None:
                    rss.append(peak_rss_mb(proc.pid))
                return rate
        finally:
            proc.terminate()
            proc.wait(timeout=30)


def backlog(size: int, seconds: float, *, rss: list[float] | None = None,
            explain: Path | None = None) -> tuple[float, float]:
    """One run of the backlog measure on a fresh scratch database: ``size`` pending rows
    staged and settled, then (claim latency ms, rows/s of :func:`drain_for` over
    ``seconds``); the claim's plan written to ``explain`` when given."""
    with scratch_database() as dsn:
        prepare(dsn)
        fill(dsn, size)
        settle(dsn)
        latency = claim_latency_ms(dsn)
        rate = drain_for(dsn, seconds, batch=100, rss=rss)
        if explain is not None:
            explain.write_text(explain_claim(dsn))
    return latency, rate


def claim_latency_ms(dsn: str, *, batch: int = 100, samples: int = 20) -> float:
    """Median time of one claim statement (rolled back, so the backlog is unchanged)."""
    from dispatcher.store.postgres import PostgresStore

    engine = db.create_engine(sa_url(dsn))
    times = []
    try:
        for _ in range(samples):
            with engine.connect() as conn:
                t0 = time.perf_counter()
                PostgresStore().claim(conn, worker="bench", limit=batch, lease_seconds=30)
                times.append((time.perf_counter() - t0) * 1000)
                conn.rollback()
    finally:
        engine.dispose()
    return sorted(times)[len(times) // 2]


def explain_claim(dsn: str, *, batch: int = 100) -> str:
    from sqlalchemy.dialects import postgresql

    from dispatcher.store.common import eligible, ops

    stmt = eligible(batch).with_for_update(skip_locked=True, of=ops)
    sql = str(stmt.compile(dialect=postgresql.dialect(), compile_kwargs={"literal_binds": True}))
    with psycopg.connect(dsn) as conn:
        rows = conn.execute("EXPLAIN (ANALYZE, BUFFERS) " + sql).fetchall()
        conn.rollback()
    return "\n".join(r[0] for r in rows)
