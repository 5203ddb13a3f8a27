"""What a drain writes to PostgreSQL's write-ahead log, per operation, by record type.

Run as ``python -m bench.wal [--rows N] [--batch B] [--no-pgqueuer]``. One ``outboxd
run`` drains ``N`` operations (null provider, rows staged with plain SQL:
``bench.daemon_runs.drain``) and one PgQueuer consumer on its asyncpg driver drains ``N``
no-op jobs (``bench.pgqueuer_run``), each on a fresh scratch database. The log between the
drain's start and its end (read with ``pg_current_wal_lsn()``, the jobs or rows staged
before it) is summed by ``pg_walinspect``'s ``pg_get_wal_stats``, the extension created in
the scratch database: for each record type, records and bytes (full-page images included)
per operation, the two side by side. Every record a write makes — a heap tuple inserted,
updated or locked, an index entry, a commit — is one here, so the table says what each
side's statements make the server do per operation, independent of this machine's speed.

The log is the cluster's: run it on a server nothing else writes to. PgQueuer is
installed into the bench environment by ``make bench``; it is never a dependency of
outboxd.
"""

from __future__ import annotations

import argparse
import importlib.util
import uuid
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any, NamedTuple

import psycopg

from bench import daemon_runs, pgqueuer_run
from bench.harness import scratch_database, wal_lsn


class WalUse(NamedTuple):
    """What one record type took over a drain, per operation."""

    records: float
    bytes: float


NONE = WalUse(0.0, 0.0)
"""A record type (or relation) a side did not write."""

_RECORDS = """
WITH db AS (
  SELECT oid, dattablespace FROM pg_database WHERE datname = current_database()
), r AS (
  SELECT resource_manager || '/' || record_type AS kind, record_length AS size,
         regexp_match(block_ref, 'rel (\\d+)/(\\d+)/(\\d+)') AS rel
  FROM pg_get_wal_records_info('0/0'::pg_lsn + %(start)s::numeric,
                               '0/0'::pg_lsn + %(end)s::numeric)
)
SELECT {key}, count(*), sum(size)
FROM r, db WHERE rel[2]::oid = db.oid
GROUP BY 1
"""
_KEYS = {
    "kind": "kind",
    "relation": "coalesce(pg_filenode_relation("
                "CASE WHEN rel[1]::oid = db.dattablespace THEN 0 ELSE rel[1]::oid END,"
                " rel[3]::oid)::text, 'relation ' || rel[3])",
}
"""What a row of :func:`wal_use` is: a record type, or the table or index written."""


def wal_use(dsn: str, start: int, end: int, operations: int, *,
            by: str = "kind") -> dict[str, WalUse]:
    """The log between positions ``start`` and ``end`` that wrote to the database ``dsn``
    (which gets the ``pg_walinspect`` extension), per operation, by record type
    (``Heap/UPDATE``, ``Btree/INSERT_LEAF``, ...) or with ``by="relation"`` by the table or
    index written; ``total`` for all of them. A record is the database's when its first
    block is: records that write no block (a commit, 0.02 an operation at batch 100) and
    other databases' are left out, so other work on the server does not count."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE EXTENSION IF NOT EXISTS pg_walinspect")
        rows = conn.execute(_RECORDS.format(key=_KEYS[by]),
                            {"start": start, "end": end}).fetchall()
    use = {str(key): WalUse(int(n) / operations, int(size) / operations)
           for key, n, size in rows}
    use["total"] = WalUse(sum(u.records for u in use.values()),
                          sum(u.bytes for u in use.values()))
    return use


@contextmanager
def wal_kept(dsn: str) -> Iterator[psycopg.Connection[Any]]:
    """The server keeps its log from now until the block ends (a temporary physical
    replication slot, reserved at once, on the connection yielded): a checkpoint during or
    after a drain would otherwise remove the segments :func:`wal_use` reads."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SELECT pg_create_physical_replication_slot(%s, true, true)",
                     (f"outboxd_bench_wal_{uuid.uuid4().hex[:12]}",))
        yield conn  # the slot ends with the session


def outboxd(rows: int, batch: int, by: str = "kind") -> tuple[float, dict[str, WalUse]]:
    """One ``outboxd run`` drain: its rate and its log per operation (:func:`wal_use`)."""
    with scratch_database() as dsn:
        daemon_runs.prepare(dsn)
        daemon_runs.fill(dsn, rows)
        with wal_kept(dsn) as conn:
            start = wal_lsn(conn)
            rate = daemon_runs.drain(dsn, rows, batch=batch)["rows_per_s"]
            end = wal_lsn(conn)
            return rate, wal_use(dsn, start, end, rows, by=by)


def pgqueuer(rows: int, batch: int, by: str = "kind") -> tuple[float, dict[str, WalUse]]:
    """One PgQueuer-asyncpg drain: its rate and its log per job (:func:`wal_use`)."""
    with scratch_database() as dsn, wal_kept(dsn):
        r = pgqueuer_run.figures(dsn, "asyncpg", rows, batch)
        return r["rows_per_s"], wal_use(dsn, int(r["wal_start"]), int(r["wal_end"]), rows,
                                          by=by)


def table(sides: Mapping[str, dict[str, WalUse]], first: str = "record type") -> str:
    """Record types (or relations) as rows, the largest first, ``total`` last; records and
    bytes per operation for each side as columns."""
    kinds = sorted({k for use in sides.values() for k in use if k != "total"},
                   key=lambda k: -max(use.get(k, NONE).bytes for use in sides.values()))
    width = max([24, *(len(k) + 2 for k in kinds)])
    head = f"{first:<{width}}" + "".join(f"{name + ' records':>18}{'bytes':>9}"
                                             for name in sides)
    lines = [head]
    for kind in [*kinds, "total"]:
        cells = "".join(f"{u.records:18.2f}{u.bytes:9,.0f}"
                        for u in (use.get(kind, NONE) for use in sides.values()))
        lines.append(f"{kind:<{width}}{cells}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.wal", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=30_000, help="operations (jobs) per drain")
    ap.add_argument("--batch", type=int, default=100, help="batch size of both")
    ap.add_argument("--no-pgqueuer", action="store_true", help="outboxd's drain only")
    ap.add_argument("--by", choices=("kind", "relation"), default="kind",
                    help="rows of the table: record types, or the tables and indexes written")
    args = ap.parse_args(argv)
    if not args.no_pgqueuer and importlib.util.find_spec("pgqueuer") is None:
        ap.error("PgQueuer is not installed here: `make bench` installs it "
                 "(or: pip install 'pgqueuer[asyncpg]>=1.6,<2'), or pass --no-pgqueuer")
    sides: dict[str, dict[str, WalUse]] = {}
    rate, sides["outboxd"] = outboxd(args.rows, args.batch, args.by)
    print(f"outboxd: {rate:,.0f} ops/s", flush=True)
    if not args.no_pgqueuer:
        rate, sides["PgQueuer"] = pgqueuer(args.rows, args.batch, args.by)
        print(f"PgQueuer: {rate:,.0f} ops/s", flush=True)
    print(f"write-ahead log per operation, {args.rows:,} operations at batch {args.batch}:")
    print(table(sides, "record type" if args.by == "kind" else "relation"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
