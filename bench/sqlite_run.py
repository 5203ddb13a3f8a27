"""outboxd on the embedded default: one ``outboxd run`` draining a SQLite file filled
with plain SQL, the same null provider and batch size as the PostgreSQL drain."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.daemon_runs import NULL_PROVIDER
from bench.harness import REPO, Deadline, cpu_seconds, log
from outbox import db, migrate


def drain_sqlite(rows: int, *, batch: int, timeout: float = 300) -> float:
    """Rows per second (first claim to last applied, on the database clock)."""
    return drain_sqlite_figures(rows, batch=batch, timeout=timeout)["rows_per_s"]


def drain_sqlite_figures(rows: int, *, batch: int, timeout: float = 300) -> dict[str, float]:
    """The drain's rows per second and the daemon's CPU per row (from the first poll that
    saw rows applied to the last row applied; here it includes SQLite's own work, which
    runs in the daemon's process)."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "bench.db"
        url = f"sqlite:///{path}"
        engine = db.create_engine(url)
        migrate.upgrade(engine)
        engine.dispose()
        with sqlite3.connect(path) as conn:
            conn.execute(
                "WITH RECURSIVE g(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM g WHERE n < ?) "
                "INSERT INTO outbox_operations"
                " (tenant_id, task_id, operation_id, provider, payload) "
                "SELECT 'bench', 'task-' || (n / 100), 'op:' || n, 'sink', "
                "json_object('n', n, 'text', 'benchmark payload') FROM g",
                (rows,),
            )
        cfg = Path(tmp) / "bench.toml"
        cfg.write_text(f"""
[database]
url = "{url}"
[dispatcher]
batch_size = {batch}
concurrency = {max(32, batch)}
poll_interval_ms = 20
log_level = "WARNING"
[metrics]
enabled = false
{NULL_PROVIDER}
""")
        proc = subprocess.Popen(
            [sys.executable, "-m", "dispatcher.cli", "run", "--config", str(cfg)],
            cwd=REPO,
            stderr=subprocess.DEVNULL,
        )
        deadline = Deadline(timeout)
        first: tuple[float, int] | None = None  # CPU seconds, rows applied at the first poll
        cpu = float("nan")  # that saw rows applied: the import and start-up left out
        try:
            with sqlite3.connect(path, timeout=30) as conn:
                while not deadline.passed():
                    time.sleep(0.25)
                    used = cpu_seconds(proc.pid)
                    applied, total = conn.execute(
                        "SELECT sum(status = 'applied'), count(*) FROM outbox_operations"
                    ).fetchone()
                    if first is None and applied:
                        first = (used, int(applied))
                    if applied >= total:
                        if first is not None and applied > first[1]:
                            cpu = (used - first[0]) / (int(applied) - first[1])
                        break
                else:
                    log(f"  sqlite drain timed out: {applied} of {total} applied")
                (span,) = conn.execute(
                    "SELECT (julianday((SELECT max(updated_at) FROM outbox_operations))"
                    " - julianday((SELECT min(created_at) FROM outbox_events"
                    " WHERE to_status = 'claimed'))) * 86400.0"
                ).fetchone()
        finally:
            proc.terminate()
            proc.wait(timeout=30)
    return {"rows_per_s": rows / float(span) if span else float("nan"),
            "cpu_us_per_row": cpu * 1e6}
