"""The schema's floor: outboxd's own PostgreSQL statements driven with almost no Python.

Run as ``python -m bench.floor [--rows N] [--batch B] [--pairs P]`` (or as a third side of
``python -m bench.gap --floor``). Each drain stages ``N`` operations with plain SQL on a
fresh scratch database migrated to outboxd's schema (``bench.daemon_runs.fill``) and
drains them with one psycopg connection running, per batch, the daemon's two hot-path
statements exactly as the store compiles them:

1. ``BEGIN; EXECUTE`` of the held claim and its mark
   (``dispatcher.store.postgres.claim_mark_statement``: ``pending -> dispatching`` under
   a fresh fencing token and lease, both events per row), then ``COMMIT``;
2. a no-op send;
3. the record (``record_statement``: each row ``applied``, fenced on its id, revision and
   token, its event and its attempt row, the settled notification), self-committing.

What it leaves out is everything the daemon does in Python around them: the rows built
into records, admission and the credential scan, the authority, the outcome decisions,
the send threads, the recording thread, metrics and logs. So its rate is what any client
of this schema and this protocol could reach on one connection with the statements as
they are, and what it spends on the server is the statements' own cost: the gap between
it and PgQueuer is the schema's and the statements', the gap between it and the daemon
is the daemon's Python.
"""

from __future__ import annotations

import argparse
import queue
import statistics
import threading
import time
from datetime import UTC, datetime
from typing import Any

import psycopg
import sqlalchemy as sa

from bench import daemon_runs, harness
from bench.harness import scratch_database
from dispatcher.store import direct
from dispatcher.store import postgres as pg_store
from outbox.records import OPERATION_FIELDS

KEYS = ("rows_per_s", "commits_per_op", "cpu_us_per_row", "server_cpu_us_per_row",
        "claim_us_per_row", "record_us_per_row")
_DIALECT = sa.create_engine("postgresql+psycopg://", module=psycopg).dialect
_AT = {name: i for i, name in enumerate(OPERATION_FIELDS)}


def _literal(conn: psycopg.Connection[Any], value: Any) -> str:
    return psycopg.sql.Literal(value).as_string(conn)


def _record_row(row: tuple[Any, ...], mark_at: int, now: str) -> dict[str, Any]:
    """What the daemon's record holds for one ``null`` send that came back applied."""
    return {
        "id": row[_AT["id"]], "rev": row[mark_at + 1], "token": row[_AT["fencing_token"]],
        "status": "applied", "reason": None, "receipt": {"null": True},
        "outcome": "applied", "delay": None, "digest": None, "detail": None,
        "a_tenant_id": row[_AT["tenant_id"]], "a_operation_id": row[_AT["operation_id"]],
        "a_attempt": row[mark_at + 2], "a_provider": row[_AT["provider"]],
        "a_started_at": now, "a_finished_at": now, "a_result_class": "applied",
        "a_status_code": None, "a_error_class": None, "a_transport_phase": "completed",
        "a_request_digest": None, "a_duration_ms": 0.01,
        "a_evidence": {"provider": "null"},
    }


def floor_drain(dsn: str, rows: int, batch: int, *, overlap: bool = False) -> dict[str, float]:
    """Drain the staged backlog at ``dsn`` (see the module's text); the figures
    ``bench.daemon_runs.drain`` reports, CPU per row over the whole drain. ``overlap``: the
    records run on a second connection in a thread of their own, each beside the next
    claim, as the daemon runs them (at most one batch waits for its record)."""
    claim = direct.prepared(pg_store.claim_mark_statement(pg_store._eligible(batch)), _DIALECT)
    record = direct.prepared(pg_store.record_statement(False), _DIALECT)
    assert claim.order is not None and record.order is not None
    n, k = len(OPERATION_FIELDS), len(pg_store.TASK_LIMIT_COLUMNS)
    commits_before = daemon_runs.writing_commits(dsn)
    recording = [0.0]
    with psycopg.connect(dsn, autocommit=True) as watch, \
            psycopg.connect(dsn, autocommit=True) as conn, \
            psycopg.connect(dsn, autocommit=True) as rconn:
        named = {**claim.fixed, "actor": "floor", "lease": 30.0}
        values = ", ".join(_literal(conn, named[p]) for p in claim.order)
        conn.execute(f"PREPARE floor_claim ({', '.join(claim.kinds)}) AS {claim.sql}")
        begin = f"BEGIN; EXECUTE floor_claim({values})"
        recorder = psycopg.RawCursor(rconn if overlap else conn)

        def write(rec: str) -> None:
            t = time.perf_counter()
            params = {**record.fixed, "rec": rec, "actor": "floor"}
            recorder.execute(record.sql, [params[p] for p in record.order], prepare=True)
            recording[0] += time.perf_counter() - t

        waiting: queue.Queue[str | None] = queue.Queue(maxsize=1)

        def record_all() -> None:
            while (rec := waiting.get()) is not None:
                write(rec)

        thread = threading.Thread(target=record_all) if overlap else None
        server_before = harness.backend_cpu(watch)
        cpu0, t0, done = time.process_time(), time.perf_counter(), 0
        claiming = 0.0
        if thread is not None:
            thread.start()
        try:
            with conn.cursor() as cur:
                while True:
                    t1 = time.perf_counter()
                    cur.execute(begin)
                    cur.nextset()
                    got = cur.fetchall()
                    conn.execute("COMMIT")
                    claiming += time.perf_counter() - t1
                    if not got:
                        break
                    now = datetime.now(UTC).isoformat()  # the no-op send
                    rec = pg_store.batch_json([_record_row(r, n + k, now) for r in got])
                    if thread is None:
                        write(rec)
                    else:
                        waiting.put(rec)
                    done += len(got)
        finally:
            if thread is not None:
                waiting.put(None)
                thread.join()
        seconds = time.perf_counter() - t0
        cpu = time.process_time() - cpu0
        server_after = harness.backend_cpu(watch)
    server = sum(s - server_before.get(p, 0.0) for p, s in server_after.items())
    commits = daemon_runs.writing_commits(dsn) - commits_before
    return {"rows_per_s": done / seconds, "commits_per_op": commits / max(done, 1),
            "cpu_us_per_row": cpu / max(done, 1) * 1e6,
            "server_cpu_us_per_row": server / max(done, 1) * 1e6,
            "claim_us_per_row": claiming / max(done, 1) * 1e6,
            "record_us_per_row": recording[0] / max(done, 1) * 1e6}


def floor(rows: int, batch: int, *, overlap: bool = False) -> dict[str, float]:
    """One drain on a fresh scratch database."""
    with scratch_database() as dsn:
        daemon_runs.prepare(dsn)
        daemon_runs.fill(dsn, rows)
        return floor_drain(dsn, rows, batch, overlap=overlap)


def overlapped(rows: int, batch: int) -> dict[str, float]:
    """:func:`floor` with each record beside the next claim."""
    return floor(rows, batch, overlap=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.floor", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=20_000, help="operations per drain")
    ap.add_argument("--batch", type=int, default=100, help="rows per claim")
    ap.add_argument("--pairs", type=int, default=3, help="drains")
    ap.add_argument("--overlap", action="store_true",
                    help="each record on a second connection, beside the next claim")
    args = ap.parse_args(argv)
    results = []
    for _ in range(args.pairs):
        r = floor(args.rows, args.batch, overlap=args.overlap)
        results.append(r)
        print(f"floor: {r['rows_per_s']:7,.0f} ops/s, {r['commits_per_op']:.3f} commits/op, "
              f"client CPU {r['cpu_us_per_row']:4.0f} µs/op, "
              f"server CPU {r['server_cpu_us_per_row']:4.0f} µs/op; wall per op: claim and mark "
              f"{r['claim_us_per_row']:.0f} µs, record {r['record_us_per_row']:.0f} µs",
              flush=True)
    m = {key: statistics.median(r[key] for r in results) for key in KEYS}
    print(f"median of {args.pairs}: {m['rows_per_s']:,.0f} ops/s, client CPU "
          f"{m['cpu_us_per_row']:.0f} µs/op, server CPU {m['server_cpu_us_per_row']:.0f} µs/op; "
          f"wall per op: claim and mark {m['claim_us_per_row']:.0f} µs, "
          f"record {m['record_us_per_row']:.0f} µs")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
