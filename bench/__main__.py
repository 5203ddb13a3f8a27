"""``make bench`` / ``python -m bench [--quick]``: every workload, side by side, in one run.

Prints one table (median and spread of a few runs) and the ratios the project tracks.
``--quick`` is the CI smoke of the harness: tiny sizes, one run each, ~10-30 seconds.
Everything is bounded and runs in throwaway databases that are dropped afterwards.
"""

from __future__ import annotations

import argparse
import importlib.util
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

from bench import daemon_runs as d
from bench import (
    floor,
    http_compare,
    latency,
    pgqueuer_run,
    pooler_run,
    rabbitmq_compare,
    raw,
    redis_compare,
    secret_scan,
    sqlite_run,
    tracing_cost,
)
from bench import harness as h


def _fresh(fn):  # type: ignore[no-untyped-def]
    def run() -> float:
        with h.scratch_database() as dsn:
            return float(fn(dsn))

    return run


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    ap.add_argument("--quick", action="store_true", help="tiny smoke of the harness (CI)")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--rows", type=int, default=50_000, help="rows for the null-provider drain")
    ap.add_argument("--backlogs", default="10000,100000,1000000")
    ap.add_argument("--out", type=Path, help="also write the table (markdown) here")
    args = ap.parse_args(argv)
    runs = 1 if args.quick else args.runs
    rows = 2_000 if args.quick else args.rows
    backlogs = [2_000] if args.quick else [int(x) for x in args.backlogs.split(",")]
    figs: list[h.Figure] = []
    ratios: list[tuple[str, float, str]] = []

    h.log("1. physical limit")
    one = h.repeat(
        "commits/s, 1-row update",
        "tx/s",
        runs,
        _fresh(lambda dsn: raw.commit_rate(dsn, 1, 1 if args.quick else 3)),
    )
    hundred = h.repeat(
        "commits/s, 100-row update",
        "tx/s",
        runs,
        _fresh(lambda dsn: raw.commit_rate(dsn, 100, 1 if args.quick else 3)),
    )
    figs += [one, hundred]

    for batch in (10, 100):
        h.log(f"2-3. raw drain vs outboxd null provider, batch {batch}")
        n = rows if batch == 100 else rows // 5
        rawf = h.repeat(
            f"raw psycopg drain, batch {batch}",
            "rows/s",
            runs,
            _fresh(lambda dsn, n=n, b=batch: raw.raw_drain(dsn, n, b)),
        )
        rawrec = h.repeat(
            f"raw drain + outboxd's records, batch {batch}",
            "rows/s",
            runs,
            _fresh(lambda dsn, n=n, b=batch: raw.raw_drain_with_records(dsn, n, b)),
            note="3 event rows + 1 attempt row per op, one statement per step",
        )

        def statements(dsn: str, n: int = n, b: int = batch) -> float:
            d.prepare(dsn)
            d.fill(dsn, n)
            return floor.floor_drain(dsn, n, b, overlap=True)["rows_per_s"]

        alone = h.repeat(
            f"outboxd's statements alone, batch {batch}", "rows/s", runs, _fresh(statements),
            note="the daemon's claim and record on its schema, each record beside the next "
                 "claim, no Python around them (bench.floor)",
        )
        figs.append(alone)
        stats: list[dict[str, float]] = []

        def ours(
            dsn: str, n: int = n, b: int = batch, stats: list[dict[str, float]] = stats
        ) -> float:
            d.prepare(dsn)
            d.fill(dsn, n)
            r = d.drain(dsn, n, batch=b)
            stats.append(r)
            return r["rows_per_s"]

        oursf = h.repeat(f"outboxd null provider, batch {batch}", "rows/s", runs, _fresh(ours))
        commits = h.Figure(
            f"commits per operation, batch {batch}",
            "tx/op",
            [s["commits_per_op"] for s in stats],
            note=f"target <= {3 / batch * 1.05:.3f}",
        )
        figs += [rawf, rawrec, oursf, commits]
        ratios.append((f"outboxd null / raw drain, batch {batch}", oursf.median / rawf.median,
                       ">= 0.8" if batch == 10 else ">= 0.6"))
        ratios.append((f"commits per operation, batch {batch}", commits.median,
                       f"<= {3 / batch * 1.05:.4f}"))
        if batch == 100 and importlib.util.find_spec("opentelemetry.sdk") is not None:
            tracedf = h.repeat(
                "outboxd null provider, batch 100, [tracing] on", "rows/s", runs,
                _fresh(lambda dsn, n=n: tracing_cost.drain_traced(dsn, n, 100)),
                note="a span per attempt, OTLP/HTTP to a loopback collector",
            )
            figs.append(tracedf)
            ratios.append(("[tracing] on / off, batch 100", tracedf.median / oursf.median,
                           "report"))
        if batch == 100:
            sqlitef = h.repeat(
                "outboxd null provider, SQLite, batch 100",
                "rows/s",
                runs,
                lambda n=n: sqlite_run.drain_sqlite(n, batch=100),
            )
            figs.append(sqlitef)
            ratios.append(
                (
                    "SQLite null / PostgreSQL null, batch 100",
                    sqlitef.median / oursf.median,
                    ">= 0.8",
                )
            )
            rss = h.Figure(
                "peak RSS, one replica",
                "MB",
                [s["rss_mb"] for s in stats],
                note=f"draining {n} rows",
            )
            figs.append(rss)

    h.log("4. HTTP provider vs raw httpx")
    http_rows = 1_000 if args.quick else 10_000
    pair: list[tuple[float, float]] = []

    def http_run(dsn: str) -> float:
        pair.append(http_compare.compare(dsn, http_rows))
        return pair[-1][0]

    httpf = h.repeat("outboxd HTTP provider", "req/s", runs, _fresh(http_run))
    rawhttp = h.Figure("raw httpx client, same receiver", "req/s", [p[1] for p in pair])
    figs += [httpf, rawhttp]
    ratios.append(("outboxd HTTP / raw httpx", httpf.median / rawhttp.median, ">= 0.8"))

    def broker_pair(compare: Callable[[str, int], tuple[float, float]],
                    names: tuple[str, str, str, str]) -> None:
        """A provider against its raw client, ``runs`` times on fresh databases: the two
        figures and their ratio (reported)."""
        ours_name, raw_name, unit, ratio_name = names
        rows = 1_000 if args.quick else 5_000
        pairs: list[tuple[float, float]] = []

        def one(dsn: str) -> float:
            pairs.append(compare(dsn, rows))
            return pairs[-1][0]

        ours = h.repeat(ours_name, unit, runs, _fresh(one))
        raw_client = h.Figure(raw_name, unit, [p[1] for p in pairs])
        figs.extend([ours, raw_client])
        ratios.append((ratio_name, ours.median / raw_client.median, "report"))

    h.log("4b. RabbitMQ provider vs raw pika publishing with confirms")
    if not rabbitmq_compare.available():
        h.log("  no RabbitMQ on 127.0.0.1:5672: skipped")
    else:
        broker_pair(rabbitmq_compare.compare, ("outboxd RabbitMQ provider",
                    "raw pika client, confirms, same broker", "msg/s",
                    "outboxd RabbitMQ / raw pika"))

    h.log("4c. Redis Streams provider vs raw redis-py XADD")
    if not redis_compare.available():
        h.log("  redis-server not installed: skipped")
    else:
        broker_pair(redis_compare.compare, ("outboxd Redis Streams provider",
                    "raw redis-py XADD, same server", "entries/s",
                    "outboxd Redis Streams / raw XADD"))

    h.log("5. Procrastinate no-op jobs")
    if importlib.util.find_spec("procrastinate") is None:
        h.log("  procrastinate not installed (make bench installs it): skipped")
    else:
        jobs = 500 if args.quick else 5_000
        best = h.Figure("Procrastinate no-op jobs (best concurrency)", "jobs/s")
        for conc in (10,) if args.quick else (1, 10, 50):
            with h.scratch_database() as dsn:
                out = subprocess.run(
                    [sys.executable, "-m", "bench.procrastinate_run", dsn, str(jobs), str(conc)],
                    cwd=h.REPO,
                    capture_output=True,
                    text=True,
                    timeout=600,
                    check=False,
                )
            try:
                best.samples.append(float(out.stdout.strip().splitlines()[-1]))
            except (ValueError, IndexError):
                h.log(f"  procrastinate run failed: {out.stderr[-500:]}")
        if best.samples:
            best.samples = [max(best.samples)]
            figs.append(best)
            null100 = next(f for f in figs if f.name == "outboxd null provider, batch 100")
            ratios.append(("outboxd null / Procrastinate", null100.median / best.median, ">= 25"))

    h.log("5b. PgQueuer no-op jobs: one consumer, asyncpg and psycopg drivers")
    if importlib.util.find_spec("pgqueuer") is None:
        h.log("  pgqueuer not installed (make bench installs it): skipped")
    else:
        for batch in (10, 100):
            pgq_jobs = rows if batch == 100 else rows // 5  # as many as outboxd drained
            ours = next(f for f in figs if f.name == f"outboxd null provider, batch {batch}")
            for driver in ("asyncpg", "psycopg"):
                per_job: list[float] = []

                def pgq(dsn: str, driver: str = driver, b: int = batch, n: int = pgq_jobs,
                        per_job: list[float] = per_job) -> float:
                    rate, commits = pgqueuer_run.run(dsn, driver, n, b)
                    per_job.append(commits)
                    return rate

                fig = h.repeat(f"PgQueuer {driver}, batch {batch}", "jobs/s", runs, _fresh(pgq))
                fig.note = (f"{pgq_jobs:,} jobs; commits per job "
                            + " / ".join(f"{c:.3f}" for c in per_job))
                figs.append(fig)
                ratios.append((f"outboxd null / PgQueuer-{driver}, batch {batch}",
                               ours.median / fig.median,
                               ">= 1.0" if driver == "asyncpg" else "report"))
                if driver == "asyncpg":
                    alone = next(f for f in figs
                                 if f.name == f"outboxd's statements alone, batch {batch}")
                    ratios.append((f"outboxd's statements alone / PgQueuer-asyncpg, "
                                   f"batch {batch}", alone.median / fig.median, "report"))

    h.log("6. commit-to-send latency")
    samples = 20 if args.quick else 200
    with h.scratch_database() as dsn:
        p50, p99 = latency.commit_to_send(dsn, samples)
    with h.scratch_database() as dsn:
        poll50, poll99 = latency.commit_to_send(dsn, samples // 2, listen=False)
    with tempfile.TemporaryDirectory() as tmp, h.scratch_database() as dsn:
        lite50, lite99 = latency.commit_to_send(dsn, samples // 2, sqlite=f"sqlite:///{tmp}/lat.db")
    figs += [
        h.Figure("commit-to-send latency p50, NOTIFY", "ms", [p50],
                 note="one operation every 10 ms"),
        h.Figure("commit-to-send latency p99, NOTIFY", "ms", [p99],
                 note="one operation every 10 ms"),
        h.Figure(
            "commit-to-send p50 / p99, PostgreSQL polling",
            "ms",
            [poll50],
            note=f"p99 {poll99:.1f} ms; poll_interval_ms 200",
        ),
        h.Figure(
            "commit-to-send p50 / p99, SQLite polling",
            "ms",
            [lite50],
            note=f"p99 {lite99:.1f} ms; poll_interval_ms 200",
        ),
    ]

    h.log("6b. the receipt back to the agent: request arrives -> wait_for returns")
    with h.scratch_database() as dsn:
        w50, w99 = latency.receipt_latency(dsn, samples)
    with h.scratch_database() as dsn:
        c50, c99 = latency.receipt_latency(dsn, max(samples, 100), waiters=100)
    with tempfile.TemporaryDirectory() as tmp, h.scratch_database() as dsn:
        s50, s99 = latency.receipt_latency(dsn, samples // 2, sqlite=f"sqlite:///{tmp}/w.db")
    figs += [
        h.Figure("receipt latency p50 / p99, PostgreSQL NOTIFY, 1 waiter", "ms", [w50],
                 note=f"p99 {w99:.1f} ms; request arrives -> wait_for returns"),
        h.Figure("receipt latency p50 / p99, PostgreSQL NOTIFY, 100 waiters", "ms", [c50],
                 note=f"p99 {c99:.1f} ms; 100 agents staging and waiting at once"),
        h.Figure("receipt latency p50 / p99, SQLite, 1 waiter", "ms", [s50],
                 note=f"p99 {s99:.1f} ms; the waiter reads with back-off"),
    ]
    ratios += [("NOTIFY commit-to-send p50, ms", p50, "<= 3"),
               ("NOTIFY commit-to-send p99, ms", p99, "<= 15")]

    h.log("7. backlog cost")
    base_rate = None
    for size in backlogs:
        peak: list[float] = []
        explain = (h.REPO / "docs" / "claim-explain.txt"
                   if size == backlogs[-1] and not args.quick else None)
        lat, rate = d.backlog(size, 3 if args.quick else 10, rss=peak, explain=explain)
        figs += [
            h.Figure(f"claim latency, {size:,} pending", "ms", [lat]),
            h.Figure(f"throughput, {size:,} pending", "rows/s", [rate]),
        ]
        if size == backlogs[-1]:
            ratios.append((f"peak RSS, one replica, {size:,} pending, MB",
                           max(peak, default=float("nan")), "<= 150"))
            figs.append(
                h.Figure(
                    f"peak RSS, one replica, {size:,}-row backlog",
                    "MB",
                    peak,
                    note="target <= 150",
                )
            )
        if base_rate is None:
            base_rate = rate
        else:
            ratios.append(
                (f"throughput {size:,} / {backlogs[0]:,} pending", rate / base_rate,
                 ">= 0.9" if size == backlogs[-1] else "report")
            )

    h.log("8. scale-out")
    scale_rows = 2_000 if args.quick else 20_000
    by_replicas: dict[tuple[int, int], float] = {}
    for batch in (10, 100):
        for replicas in (1, 2) if args.quick else (1, 2, 4):
            with h.scratch_database() as dsn:
                d.prepare(dsn)
                d.fill(dsn, scale_rows)
                by_replicas[(batch, replicas)] = d.drain(
                    dsn, scale_rows, batch=batch, replicas=replicas
                )["rows_per_s"]
            figs.append(
                h.Figure(
                    f"{replicas} replica(s), batch {batch}",
                    "rows/s",
                    [by_replicas[(batch, replicas)]],
                )
            )
        ratios.append(
            (
                f"2 replicas / 1, batch {batch}",
                by_replicas[(batch, 2)] / by_replicas[(batch, 1)],
                ">= 1.3" if batch == 10 else ">= 1.0",
            )
        )

    h.log("9. transaction pooling (PgBouncer) vs direct")
    # pairs of drains, direct and pooled back to back: the ratio is the median of the
    # pairs' ratios (see bench.pooler_run); at least five pairs, 40,000 rows each (about
    # 8 s at two replicas; with 20,000 the start-up and the last batches weighed too much)
    pooler_rows = 6_000 if args.quick else 40_000
    for replicas in (1, 2):
        pooled = pooler_run.pooled_vs_direct(1 if args.quick else max(runs, 5), pooler_rows,
                                             replicas=replicas)
        if pooled is not None:
            figs += list(pooled)
            ratios.append((f"PgBouncer transaction pooling / direct, {replicas} replica(s),"
                           " batch 100", pooled[2].median, ">= 0.8"))

    h.log("10. checkpoint cost: advance() with one staged operation")
    with h.scratch_database() as dsn:
        p50, p99, rate = latency.checkpoint_cost(h.sa_url(dsn), 50 if args.quick else 500)
    figs += [
        h.Figure("advance() PostgreSQL p50 / p99", "ms", [p50], note=f"p99 {p99:.2f} ms"),
        h.Figure("advance() PostgreSQL", "commits/s", [rate]),
    ]
    with tempfile.TemporaryDirectory() as tmp:
        p50s, p99s, rate_s = latency.checkpoint_cost(
            f"sqlite:///{tmp}/cp.db", 50 if args.quick else 500
        )
    figs += [
        h.Figure("advance() SQLite p50 / p99", "ms", [p50s], note=f"p99 {p99s:.2f} ms"),
        h.Figure("advance() SQLite", "commits/s", [rate_s]),
    ]

    h.log("11. credential scan per operation (enqueue: batch 1; admission: 10 and 100)")
    for size in (1, 10, 100):
        figs.append(h.Figure(f"credential scan, batch {size}", "µs/op",
                             [secret_scan.per_operation(size, 1.0 if args.quick else 3.0)]))

    text = h.table(figs, ratios)
    header = f"commit {h.git_commit()}; `python -m bench {' '.join(argv or sys.argv[1:])}`\n\n"
    print(header + text)
    if args.out:
        args.out.write_text(header + text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
