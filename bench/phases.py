"""Where a batch's wall time goes: one replica draining a backlog, with its phases timed.

Run as ``python -m bench.phases [--rows N] [--batch B]``: stages ``N`` operations on a
scratch PostgreSQL database, runs ``outboxd run`` (the null provider) in a child process
whose worker phases and psycopg executions are wrapped with ``perf_counter`` timers, and
prints, per claimed batch, the time of each phase and of the SQL inside it, then the
claiming thread's Python step by step (:data:`STEPS`). What is not SQL is Python in the
claiming thread. Profiling aid only: the timers cost a little (a step timed per row, such
as the checks, a few tenths of a microsecond a call).
"""

from __future__ import annotations

import argparse
import atexit
import collections
import json
import runpy
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg

from bench.daemon_runs import NULL_PROVIDER, drain_seconds, fill, prepare, write_config
from bench.harness import REPO, Deadline, scratch_database

RECORDER = "outboxd-record"
"""The recording thread's name prefix (dispatcher.engine.worker)."""
PHASES = {  # label: (module, attribute path)
    "claim and mark statement": ("dispatcher.store.postgres", "PostgresStore.claim_and_mark"),
    "claim statement (two steps)": ("dispatcher.store.postgres", "PostgresStore.claim"),
    "dispatching transaction": ("dispatcher.engine.worker", "Worker._commit_dispatching"),
    "record transaction": ("dispatcher.engine.worker", "Worker._record"),
}
STEPS = {  # label: (module, attribute path) -- the claiming thread's Python, step by step
    "a claim's turn of the loop (claim_and_dispatch)":
        ("dispatcher.engine.worker", "Worker.claim_and_dispatch"),
    "rows built (OperationRecord.from_raw_values)":
        ("outbox.records", "OperationRecord.from_raw_values"),
    "credential scan of the batch (scan_stored)": ("dispatcher.engine.worker", "scan_stored"),
    "checks of each row (pre_dispatch)": ("dispatcher.engine.worker", "pre_dispatch"),
    "  of which admission (admit)": ("dispatcher.engine.checks", "admit"),
    "sends handed to their threads (submit)": ("dispatcher.engine.worker", "SendThreads.submit"),
    "records handed off (record_done)": ("dispatcher.engine.worker", "Worker.record_done"),
    "leases extended (extend_leases)": ("dispatcher.engine.worker", "Worker.extend_leases"),
}
"""Steps inside the phases, each where the worker calls it (a function the worker imported
by name is wrapped in the worker's module). The calls are counted too: a turn of the loop
that finds no free slots claims nothing."""


def _child(report: str, argv: list[str]) -> None:
    """In the daemon's process: wrap the phases and psycopg's execute, then run the CLI."""
    import importlib

    totals: collections.Counter[str] = collections.Counter()
    counts: collections.Counter[str] = collections.Counter()

    def timed(label: str | Callable[..., str], fn: Callable[..., Any]) -> Callable[..., Any]:
        """``fn`` with its time added under ``label`` (or ``label(*args)``)."""

        def wrapper(*args: Any, **kwargs: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                key = label if isinstance(label, str) else label(*args)
                totals[key] += time.perf_counter() - t0
                counts[key] += 1

        return wrapper

    for label, (module, path) in {**PHASES, **STEPS}.items():
        owner: Any = importlib.import_module(module)
        *parents, name = path.split(".")
        for parent in parents:
            owner = getattr(owner, parent)
        setattr(owner, name, timed(label, getattr(owner, name)))
    def statement(_cursor: object, query: object, *_: object) -> str:
        # the record runs on a thread of its own, beside the claiming thread's statements
        where = "recorder " if threading.current_thread().name.startswith(RECORDER) else ""
        return where + "SQL " + " ".join(str(query).split()[:3])[:40]

    psycopg.Cursor.execute = timed(statement, psycopg.Cursor.execute)  # type: ignore[method-assign]
    atexit.register(lambda: Path(report).write_text(json.dumps(
        {k: [totals[k], counts[k]] for k in totals})))
    sys.argv = ["outboxd", *argv]
    runpy.run_module("dispatcher.cli", run_name="__main__")


def measure(rows: int, batch: int) -> tuple[float, dict[str, tuple[float, int]]]:
    with scratch_database("outboxd_phases") as dsn, tempfile.TemporaryDirectory() as tmp:
        prepare(dsn)
        fill(dsn, rows)
        cfg = write_config(Path(tmp), dsn, batch=batch, provider=NULL_PROVIDER)
        report = Path(tmp) / "phases.json"
        proc = subprocess.Popen(
            [sys.executable, "-m", "bench.phases", "--child", str(report),
             "run", "--config", str(cfg)],
            cwd=REPO, stderr=subprocess.DEVNULL,
        )
        deadline = Deadline(600)
        try:
            with psycopg.connect(dsn, autocommit=True) as conn:
                while not deadline.passed():
                    time.sleep(0.2)
                    row = conn.execute("SELECT count(*) FROM outbox_operations"
                                       " WHERE status = 'applied'").fetchone()
                    if row is not None and row[0] >= rows:
                        break
                seconds = drain_seconds(conn)
        finally:
            proc.send_signal(2)  # SIGINT: a clean stop runs the report's atexit hook
            proc.wait(timeout=60)
        raw = json.loads(report.read_text())
    return seconds, {k: (float(v[0]), int(v[1])) for k, v in raw.items()}


def main(argv: list[str] | None = None) -> int:
    args_in = sys.argv[1:] if argv is None else argv
    if args_in[:1] == ["--child"]:
        _child(args_in[1], args_in[2:])
        return 0
    parser = argparse.ArgumentParser(prog="python -m bench.phases", description=__doc__)
    parser.add_argument("--rows", type=int, default=20_000)
    parser.add_argument("--batch", type=int, default=100)
    args = parser.parse_args(args_in)
    seconds, phases = measure(args.rows, args.batch)
    batches = phases.get("dispatching transaction", (0.0, 1))[1] or 1  # claims with rows
    per_claim = 1000 * seconds / batches
    print(f"{args.rows:,} rows at batch {args.batch}: {args.rows / seconds:,.0f} rows/s, "
          f"{per_claim:.1f} ms of wall time per claim")
    sql = sum(t for k, (t, _) in phases.items() if k.startswith("SQL ")) * 1000 / batches
    print(f"the claiming thread's SQL, waited for (round trips included): {sql:.1f} ms per "
          f"claim; the rest of its wall time, {per_claim - sql:.1f} ms, is its Python (the "
          "record runs on the recording thread beside it: 'recorder' rows)")
    steps = {k: v for k, v in phases.items() if k in STEPS}
    print(f"{'phase or statement':48s} {'ms per claim':>12s} {'calls':>7s}")
    for label, (total, calls) in sorted(phases.items(), key=lambda kv: -kv[1][0]):
        if label not in steps:
            print(f"{label:48s} {1000 * total / batches:12.2f} {calls:7d}")
    print(f"{'step of the claiming thread (inside the above)':48s} {'ms per claim':>12s} "
          f"{'calls':>7s}")
    for label in STEPS:
        total, calls = steps.get(label, (0.0, 0))
        print(f"{label:48s} {1000 * total / batches:12.2f} {calls:7d}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
