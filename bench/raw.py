"""Reference loops written directly against psycopg: the physical commit limit, and a raw
drain with the same durability protocol as outboxd (claim with lease and fencing token ->
commit -> mark "dispatch may have occurred" -> commit -> no-op send -> fenced record ->
commit), at the same batch size."""

from __future__ import annotations

import time

import psycopg

SETUP = """
CREATE TABLE IF NOT EXISTS bench_counter (id int PRIMARY KEY, v bigint NOT NULL);
INSERT INTO bench_counter SELECT g, 0 FROM generate_series(1, 100) g ON CONFLICT DO NOTHING;
CREATE SEQUENCE IF NOT EXISTS bench_fencing;
CREATE TABLE IF NOT EXISTS bench_raw (
  id bigserial PRIMARY KEY, status text NOT NULL DEFAULT 'pending', token bigint,
  lease_owner text, lease_expires_at timestamptz, attempts int NOT NULL DEFAULT 0,
  revision bigint NOT NULL DEFAULT 0, receipt jsonb, payload jsonb NOT NULL);
CREATE INDEX IF NOT EXISTS bench_raw_pending ON bench_raw (id) WHERE status = 'pending';
CREATE TABLE IF NOT EXISTS bench_raw_events (
  id bigserial PRIMARY KEY, row_id bigint NOT NULL, from_status text, to_status text,
  token bigint, created_at timestamptz NOT NULL DEFAULT statement_timestamp());
CREATE TABLE IF NOT EXISTS bench_raw_attempts (
  id bigserial PRIMARY KEY, row_id bigint NOT NULL, token bigint, result text,
  evidence jsonb, created_at timestamptz NOT NULL DEFAULT statement_timestamp());
"""


def commit_rate(dsn: str, rows_per_commit: int, seconds: float = 2.0) -> float:
    """Update transactions per second with one client."""
    with psycopg.connect(dsn) as conn:
        conn.execute(SETUP)
        conn.commit()
        n, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            conn.execute("UPDATE bench_counter SET v = v + 1 WHERE id <= %s", (rows_per_commit,))
            conn.commit()
            n += 1
        return n / (time.perf_counter() - t0)


def fill_raw(dsn: str, rows: int) -> None:
    with psycopg.connect(dsn) as conn:
        conn.execute(SETUP)
        conn.execute("TRUNCATE bench_raw")
        conn.execute(
            "INSERT INTO bench_raw (payload) SELECT jsonb_build_object('n', g) "
            "FROM generate_series(1, %s) g",
            (rows,),
        )
        conn.commit()


def raw_drain(dsn: str, rows: int, batch: int) -> float:
    """Rows per second through the three-commit protocol."""
    fill_raw(dsn, rows)
    done, t0 = 0, time.perf_counter()
    with psycopg.connect(dsn) as conn:
        while True:
            claimed = conn.execute(
                "UPDATE bench_raw SET status = 'claimed',"
                " token = (SELECT nextval('bench_fencing')),"
                " lease_owner = 'raw', lease_expires_at = statement_timestamp() + interval '30 s',"
                " revision = revision + 1 WHERE id IN (SELECT id FROM bench_raw"
                " WHERE status = 'pending' ORDER BY id LIMIT %s FOR UPDATE SKIP LOCKED)"
                " RETURNING id, token, revision",
                (batch,),
            ).fetchall()
            conn.commit()
            if not claimed:
                break
            token = claimed[0][1]
            ids = [r[0] for r in claimed]
            marked = conn.execute(
                "UPDATE bench_raw SET status = 'dispatching', attempts = attempts + 1,"
                " revision = revision + 1 WHERE id = ANY(%s) AND token = %s"
                " AND status = 'claimed' RETURNING id, revision",
                (ids, token),
            ).fetchall()
            conn.commit()
            with conn.cursor() as cur:  # the "send" is a no-op; record fenced receipts
                cur.executemany(
                    "UPDATE bench_raw SET status = 'applied', receipt = '{\"ok\": true}',"
                    " revision = revision + 1 WHERE id = %s AND revision = %s AND token = %s",
                    [(i, rev, token) for i, rev in marked],
                )
            conn.commit()
            done += len(marked)
    return done / (time.perf_counter() - t0)


def raw_drain_with_records(dsn: str, rows: int, batch: int) -> float:
    """The same three commits, each also writing the evidence outboxd writes: an event row
    per transition (three per row) and an attempt row per send, in the same statement
    (data-modifying CTEs). Not a target: it shows what the records cost in SQL alone."""
    fill_raw(dsn, rows)
    done, t0 = 0, time.perf_counter()
    with psycopg.connect(dsn, autocommit=True) as conn:
        while True:
            claimed = conn.execute(
                "WITH c AS (UPDATE bench_raw SET status = 'claimed',"
                " token = (SELECT nextval('bench_fencing')), lease_owner = 'raw',"
                " lease_expires_at = statement_timestamp() + interval '30 s',"
                " revision = revision + 1 WHERE id IN (SELECT id FROM bench_raw"
                " WHERE status = 'pending' ORDER BY id LIMIT %s FOR UPDATE SKIP LOCKED)"
                " RETURNING id, token, revision),"
                " e AS (INSERT INTO bench_raw_events (row_id, from_status, to_status, token)"
                " SELECT id, 'pending', 'claimed', token FROM c)"
                " SELECT id, token, revision FROM c",
                (batch,),
            ).fetchall()
            if not claimed:
                break
            token = claimed[0][1]
            with conn.transaction():
                marked = conn.execute(
                    "WITH m AS (UPDATE bench_raw SET status = 'dispatching',"
                    " attempts = attempts + 1, revision = revision + 1"
                    " WHERE id = ANY(%s) AND token = %s AND status = 'claimed'"
                    " RETURNING id, revision, token),"
                    " e AS (INSERT INTO bench_raw_events (row_id, from_status, to_status, token)"
                    " SELECT id, 'claimed', 'dispatching', token FROM m)"
                    " SELECT id, revision FROM m",
                    ([r[0] for r in claimed], token),
                ).fetchall()
            conn.execute(  # the "send" is a no-op; record fenced receipts with evidence
                "WITH v AS (SELECT * FROM unnest(%s::bigint[], %s::bigint[]) AS v(id, rev)),"
                " r AS (UPDATE bench_raw b SET status = 'applied', receipt = '{\"ok\": true}',"
                " revision = b.revision + 1 FROM v WHERE b.id = v.id AND b.revision = v.rev"
                " AND b.token = %s RETURNING b.id),"
                " e AS (INSERT INTO bench_raw_events (row_id, from_status, to_status, token)"
                " SELECT id, 'dispatching', 'applied', %s FROM r)"
                " INSERT INTO bench_raw_attempts (row_id, token, result, evidence)"
                " SELECT id, %s, 'applied', '{\"status_code\": 200}' FROM v",
                ([i for i, _ in marked], [rev for _, rev in marked], token, token, token),
            )
            done += len(marked)
    return done / (time.perf_counter() - t0)
