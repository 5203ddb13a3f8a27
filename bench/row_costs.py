"""What a status change of an operation row costs the server, and what the schema makes of it.

Run as ``python -m bench.row_costs [--rows N] [--rounds R]``. On a scratch database with
``N`` operations staged with plain SQL and settled (``VACUUM (ANALYZE)``, a checkpoint), in
µs per row, medians of ``R`` rounds of 100-row statements:

* **indexes** — the record's kind of update (``dispatching → applied``: status, lease,
  revision, ``updated_at``; a non-HOT update, since indexed columns change) with all of
  ``outbox_operations``' indexes, then with each one dropped in turn, and with every
  secondary index dropped, each inside a transaction that is rolled back (the rows are
  moved to ``dispatching`` first, in the same transaction). What the update costs less
  what it costs without an index is that index's share. The primary key stays: the
  statements find their rows by it.
* **split** — the mark (``pending → dispatching``) and the record as the schema has them,
  on a fresh copy of the table with all its indexes, against a prototype of another
  schema: the status-dependent indexes (pending rows, leases) moved to two narrow tables
  whose rows are deleted and inserted as the status changes, and a copy of the operations
  table (``--fillfactor``, 70 unless given) that keeps only the indexes on columns that
  never change — so its updates can be HOT (no index touched). Each statement committed;
  the share of the prototype's updates that were HOT is printed.

Nothing of outboxd runs here: the statements are written for the experiment, to size a
schema change before it is built (``docs/performance.md``).
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import psycopg

from bench import daemon_runs
from bench.harness import scratch_database, wal_lsn

BATCH = 100
TO_DISPATCHING = (
    "UPDATE outbox_operations SET status = 'dispatching', fencing_token = 7, lease_owner = 'w',"
    " lease_expires_at = now() + interval '1 minute', state_revision = state_revision + 1"
    " WHERE id BETWEEN %(a)s AND %(b)s"
)
RECORD = (
    "UPDATE {table} SET status = 'applied', receipt = '{{\"id\": 1}}', lease_owner = NULL,"
    " lease_expires_at = NULL, state_revision = state_revision + 1, updated_at = now()"
)
MARK = (
    "UPDATE {table} SET status = 'dispatching', fencing_token = 7, lease_owner = 'w',"
    " lease_expires_at = now() + interval '1 minute', attempts = attempts + 1,"
    " first_dispatched_at = now(), last_attempt_started_at = now(),"
    " state_revision = state_revision + 1, updated_at = now()"
)
SPLIT_SCHEMA = (
    # both sides fresh copies of the same rows, so neither inherits the other's dead rows
    "CREATE TABLE ops_now (LIKE outbox_operations INCLUDING ALL)",
    "INSERT INTO ops_now SELECT * FROM outbox_operations",
    "CREATE TABLE ops_split (LIKE outbox_operations INCLUDING DEFAULTS)"
    " WITH (fillfactor = {fillfactor})",
    "INSERT INTO ops_split SELECT * FROM outbox_operations",
    "ALTER TABLE ops_split ADD PRIMARY KEY (id)",
    "CREATE UNIQUE INDEX ON ops_split (tenant_id, operation_id)",
    "CREATE UNIQUE INDEX ON ops_split (tenant_id, provider, idempotency_key)",
    "CREATE INDEX ON ops_split (tenant_id, task_id)",
    "CREATE INDEX ON ops_split (ordering_key, id) WHERE ordering_key IS NOT NULL",
    "CREATE TABLE ready_split (id bigint PRIMARY KEY, due timestamptz)",
    "CREATE INDEX ON ready_split (due, id)",
    "INSERT INTO ready_split SELECT id, next_attempt_at FROM outbox_operations",
    "CREATE TABLE leases_split (id bigint PRIMARY KEY, expires timestamptz NOT NULL)",
    "CREATE INDEX ON leases_split (expires)",
)


def _indexes(conn: psycopg.Connection[Any]) -> list[tuple[str, str | None]]:
    """(index, the constraint it backs) for every index of ``outbox_operations``."""
    return [(str(n), c) for n, c in conn.execute(
        "SELECT i.relname, c.conname FROM pg_index x JOIN pg_class i ON i.oid = x.indexrelid"
        " LEFT JOIN pg_constraint c ON c.conindid = x.indexrelid"
        " WHERE x.indrelid = 'outbox_operations'::regclass ORDER BY i.relname").fetchall()]


def _drop(conn: psycopg.Connection[Any], index: str, constraint: str | None) -> None:
    if constraint:
        conn.execute(f"ALTER TABLE outbox_operations DROP CONSTRAINT {constraint} CASCADE")
    else:
        conn.execute(f"DROP INDEX {index}")


def index_shares(conn: psycopg.Connection[Any], rows: int, rounds: int) -> dict[str, float]:
    """µs per row of the record's update: with every index, without each, without all
    secondary ones (the primary key kept)."""
    indexes = _indexes(conn)
    variants: list[tuple[str, list[tuple[str, str | None]]]] = [("every index", [])]
    # the primary key stays: the statements find their rows by it
    variants += [(f"without {n}", [(n, c)]) for n, c in indexes if not n.startswith("pk_")]
    variants.append(("without every secondary index",
                     [(n, c) for n, c in indexes if not n.startswith("pk_")]))
    times: dict[str, list[float]] = {name: [] for name, _ in variants}
    record = RECORD.format(table="outbox_operations") + " WHERE id BETWEEN %(a)s AND %(b)s"
    for i in range(rounds):
        first = 1 + (i * BATCH) % max(rows - BATCH, 1)
        span = {"a": first, "b": first + BATCH - 1}
        turn = i % len(variants)  # each variant first in turn: none gains from its place
        for name, dropped in variants[turn:] + variants[:turn]:
            with conn.transaction(force_rollback=True):
                conn.execute(TO_DISPATCHING, span)
                for index, constraint in dropped:
                    _drop(conn, index, constraint)
                t0 = time.perf_counter()
                conn.execute(record, span)
                times[name].append((time.perf_counter() - t0) * 1e6 / BATCH)
    return {name: statistics.median(ts) for name, ts in times.items()}


def split_costs(
    conn: psycopg.Connection[Any], rows: int, rounds: int, fillfactor: int = 70
) -> dict[str, float]:
    """µs per row, commit included, of the mark and the record as the schema has them and
    in the split prototype (its operations table at ``fillfactor``); the bytes of
    write-ahead log each writes per row (the log's position before and after each
    statement's transaction: run it on a server nothing else writes to); and the share of
    the prototype's updates that were HOT."""
    for ddl in SPLIT_SCHEMA:
        conn.execute(ddl.format(fillfactor=int(fillfactor)))
    conn.execute("VACUUM (ANALYZE) ops_now, ops_split, ready_split, leases_split")
    where = " WHERE id BETWEEN %(a)s AND %(b)s"
    statements: dict[str, str] = {
        "mark, as the schema is": MARK.format(table="ops_now") + where
        + " AND status = 'pending'",
        "record, as the schema is": RECORD.format(table="ops_now") + where
        + " AND status = 'dispatching'",
        "mark, split": (
            "WITH r AS (DELETE FROM ready_split" + where + " RETURNING id),"
            " l AS (INSERT INTO leases_split SELECT id, now() + interval '1 minute' FROM r) "
            + MARK.format(table="ops_split") + " FROM r WHERE ops_split.id = r.id"),
        "record, split": (
            "WITH l AS (DELETE FROM leases_split" + where + " RETURNING id) "
            + RECORD.format(table="ops_split") + " FROM l WHERE ops_split.id = l.id"),
    }
    times: dict[str, list[float]] = {name: [] for name in statements}
    logged: dict[str, list[float]] = {name: [] for name in statements}
    for i in range(min(rounds, rows // BATCH)):
        span = {"a": 1 + i * BATCH, "b": (i + 1) * BATCH}
        for name, sql in statements.items():
            before = wal_lsn(conn)
            t0 = time.perf_counter()
            with conn.transaction():
                conn.execute(sql, span)
            times[name].append((time.perf_counter() - t0) * 1e6 / BATCH)
            logged[name].append((wal_lsn(conn) - before) / BATCH)
    result = {name: statistics.median(ts) for name, ts in times.items()}
    result |= {f"{name}, log bytes": statistics.median(b) for name, b in logged.items()}
    conn.execute("SELECT pg_stat_force_next_flush()")  # this backend's counts, when idle
    conn.execute("SELECT pg_stat_clear_snapshot()")
    row = conn.execute("SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables"
                       " WHERE relname = 'ops_split'").fetchone()
    result["share of the split's updates that were HOT"] = (
        row[1] / row[0] if row and row[0] else float("nan"))
    return result


def measure(rows: int, rounds: int, fillfactor: int = 70) -> dict[str, dict[str, float]]:
    with scratch_database("outboxd_rows") as dsn:
        daemon_runs.prepare(dsn)
        daemon_runs.fill(dsn, rows)
        daemon_runs.settle(dsn)
        with psycopg.connect(dsn, autocommit=True) as conn:
            return {"indexes": index_shares(conn, rows, rounds),
                    "split": split_costs(conn, rows, rounds, fillfactor)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.row_costs", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=20_000, help="operations staged")
    ap.add_argument("--rounds", type=int, default=40, help="100-row statements per figure")
    ap.add_argument("--fillfactor", type=int, default=70, choices=range(10, 101),
                    metavar="10..100", help="the split prototype's operations table")
    args = ap.parse_args(argv)
    for part, figures in measure(args.rows, args.rounds, args.fillfactor).items():
        print(f"{part}:")
        for name, value in figures.items():
            unit = "" if "share" in name else " a row" if "bytes" in name else " µs a row"
            print(f"  {name}: {value:.2f}{unit}" if not unit else f"  {name}: {value:.1f}{unit}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
