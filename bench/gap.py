"""Where outboxd's time per operation goes against PgQueuer's, drain by drain.

Run as ``python -m bench.gap [--rows N] [--batch B] [--pairs P]``. Each pair drains ``N``
operations with one ``outboxd run`` (null provider, rows staged with plain SQL:
``bench.daemon_runs.drain``) and ``N`` no-op jobs with one PgQueuer consumer on its
asyncpg driver (``bench.pgqueuer_run``), each on a fresh scratch database, alternating
which goes first. For each it prints the rate, the commits per operation, and the CPU time
per operation of the client process (the daemon, or PgQueuer's consumer) and of the
database's server processes, then the medians side by side: the rate says who is ahead,
the two CPU figures say on which side of the connection the difference lies.

``--floor`` adds two sides, the same backlog drained by outboxd's own two hot-path
statements with almost no Python around them (``bench.floor``), on one connection and
with each record beside the next claim as the daemon runs them: how far the schema and
the statements alone get, against PgQueuer and against the daemon.

PgQueuer is installed into the bench environment by ``make bench``; it is never a
dependency of outboxd.
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
from collections.abc import Callable

from bench import daemon_runs, pgqueuer_run
from bench.floor import floor, overlapped
from bench.harness import scratch_database

KEYS = ("rows_per_s", "commits_per_op", "cpu_us_per_row", "server_cpu_us_per_row")


def outboxd(rows: int, batch: int) -> dict[str, float]:
    with scratch_database() as dsn:
        daemon_runs.prepare(dsn)
        daemon_runs.fill(dsn, rows)
        return daemon_runs.drain(dsn, rows, batch=batch)


def pgqueuer(rows: int, batch: int) -> dict[str, float]:
    with scratch_database() as dsn:
        return pgqueuer_run.figures(dsn, "asyncpg", rows, batch)


def line(name: str, r: dict[str, float]) -> str:
    return (f"{name:>9}: {r['rows_per_s']:7,.0f} ops/s, {r['commits_per_op']:.3f} commits/op, "
            f"client CPU {r['cpu_us_per_row']:4.0f} µs/op, "
            f"server CPU {r['server_cpu_us_per_row']:4.0f} µs/op")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.gap", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=20_000, help="operations (jobs) per drain")
    ap.add_argument("--batch", type=int, default=10, help="batch size of both")
    ap.add_argument("--pairs", type=int, default=3, help="drains of each")
    ap.add_argument("--floor", action="store_true",
                    help="also drain with outboxd's statements and almost no Python, on one "
                         "connection (floor) and with each record beside the next claim "
                         "(overlap)")
    args = ap.parse_args(argv)
    if importlib.util.find_spec("pgqueuer") is None:
        ap.error("PgQueuer is not installed here: `make bench` installs it "
                 "(or: pip install 'pgqueuer[asyncpg]>=1.6,<2')")
    sides: dict[str, Callable[[int, int], dict[str, float]]] = {
        "outboxd": outboxd, "PgQueuer": pgqueuer}
    if args.floor:
        sides["floor"] = floor
        sides["overlap"] = overlapped
    results: dict[str, list[dict[str, float]]] = {name: [] for name in sides}
    for i in range(args.pairs):
        order = list(sides) if i % 2 == 0 else list(reversed(sides))
        for name in order:
            r = sides[name](args.rows, args.batch)
            results[name].append(r)
            print(line(name, r), flush=True)
    medians = {name: {k: statistics.median(r[k] for r in rs) for k in KEYS}
               for name, rs in results.items()}
    print(f"medians of {args.pairs}, {args.rows:,} operations at batch {args.batch}:")
    for name, m in medians.items():
        print(line(name, m))
    ours, theirs = medians["outboxd"], medians["PgQueuer"]
    print(f"outboxd / PgQueuer: rate {ours['rows_per_s'] / theirs['rows_per_s']:.2f}, "
          f"client CPU {ours['cpu_us_per_row'] / theirs['cpu_us_per_row']:.2f}, "
          f"server CPU {ours['server_cpu_us_per_row'] / theirs['server_cpu_us_per_row']:.2f}")
    if args.floor:
        for name in ("floor", "overlap"):
            least = medians[name]
            print(f"{name} / PgQueuer: rate {least['rows_per_s'] / theirs['rows_per_s']:.2f}, "
                  f"server CPU "
                  f"{least['server_cpu_us_per_row'] / theirs['server_cpu_us_per_row']:.2f}; "
                  f"outboxd / {name}: rate {ours['rows_per_s'] / least['rows_per_s']:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
