"""One change measured on its own: two checkouts drain the same backlog, alternately.

Run as ``python -m bench.compare BEFORE AFTER [--rows N] [--batch B] [--pairs P]``, where
BEFORE and AFTER are directories holding a checkout each (``git worktree add`` or ``git
archive | tar -x``). Each drain is a fresh scratch PostgreSQL database, ``N`` operations
staged with plain SQL, one ``outboxd run`` of that checkout with the null provider
(``bench.daemon_runs.drain``, run from that checkout with this interpreter); with
``--sqlite``, a fresh SQLite file instead (``bench.sqlite_run``), where the daemon's CPU
includes SQLite's own work. The order
alternates (A B, B A, ...) so a machine getting faster or slower during the run weighs on
both sides alike. Prints each drain, then the medians and AFTER / BEFORE: of the rate, and
of the daemon's CPU time per row from its first applied row to its last (a figure a busy
neighbour on a shared machine moves less than it moves the rate), and on PostgreSQL of the
CPU time the database's server processes used per row over the same span (a server on
this machine only).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

CHILD = """
import json
from bench import daemon_runs as d, harness as h
with h.scratch_database() as dsn:
    d.prepare(dsn)
    d.fill(dsn, {rows})
    print(json.dumps(d.drain(dsn, {rows}, batch={batch})))
"""

SQLITE_CHILD = """
import json
from bench import sqlite_run as s
if hasattr(s, "drain_sqlite_figures"):
    r = s.drain_sqlite_figures({rows}, batch={batch})
else:  # a checkout from before the SQLite drain reported its CPU
    r = {{"rows_per_s": s.drain_sqlite({rows}, batch={batch})}}
print(json.dumps({{"commits_per_op": float("nan"), **r}}))
"""


def drain_with(tree: Path, rows: int, batch: int, *, sqlite: bool = False) -> dict[str, float]:
    """One drain by the checkout at ``tree`` (its packages first on the path)."""
    child = SQLITE_CHILD if sqlite else CHILD
    done = subprocess.run(
        [sys.executable, "-c", child.format(rows=rows, batch=batch)],
        env={**os.environ, "PYTHONPATH": str(tree)},
        cwd=tree, capture_output=True, text=True, check=False,
    )  # fmt: skip
    if done.returncode:
        raise SystemExit(f"the drain of {tree} failed:\n{done.stderr[-2000:]}")
    result: dict[str, float] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.compare", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("before", type=Path, help="the checkout without the change")
    ap.add_argument("after", type=Path, help="the checkout with the change")
    ap.add_argument("--rows", type=int, default=10_000, help="operations per drain")
    ap.add_argument("--batch", type=int, default=10, help="the daemon's batch_size")
    ap.add_argument("--pairs", type=int, default=3, help="drains of each checkout")
    ap.add_argument("--sqlite", action="store_true",
                    help="drain a SQLite file instead of a PostgreSQL database")
    args = ap.parse_args(argv)
    for tree in (args.before, args.after):
        if not (tree / "dispatcher").is_dir():
            ap.error(f"{tree}: not a checkout of outboxd (no dispatcher/ in it)")
    rates: dict[Path, list[float]] = {args.before: [], args.after: []}
    cpu: dict[Path, list[float]] = {args.before: [], args.after: []}
    server: dict[Path, list[float]] = {args.before: [], args.after: []}
    for i in range(args.pairs):
        order = (args.before, args.after) if i % 2 == 0 else (args.after, args.before)
        for tree in order:
            r = drain_with(tree, args.rows, args.batch, sqlite=args.sqlite)
            rates[tree].append(r["rows_per_s"])
            # a checkout from before the daemon's CPU was measured reports none
            cpu[tree].append(r.get("cpu_us_per_row", float("nan")))
            server[tree].append(r.get("server_cpu_us_per_row", float("nan")))
            print(f"{tree}: {r['rows_per_s']:,.0f} rows/s, "
                  f"{r['commits_per_op']:.4f} commits/op, "
                  f"daemon CPU {cpu[tree][-1]:.0f} µs/row, "
                  f"server CPU {server[tree][-1]:.0f} µs/row", flush=True)
    before = statistics.median(rates[args.before])
    after = statistics.median(rates[args.after])
    print(f"median: before {before:,.0f}, after {after:,.0f} rows/s; "
          f"after / before {after / before:.2f}")
    cpu_before = statistics.median(cpu[args.before])
    cpu_after = statistics.median(cpu[args.after])
    print(f"daemon CPU per row (median; steadier than the rate on a shared machine): "
          f"before {cpu_before:.0f}, after {cpu_after:.0f} µs; "
          f"after / before {cpu_after / cpu_before:.2f}")
    if not args.sqlite:  # SQLite runs in the daemon's process: its CPU is the daemon's
        server_before = statistics.median(server[args.before])
        server_after = statistics.median(server[args.after])
        print(f"server CPU per row (median; the database's processes, on this machine): "
              f"before {server_before:.0f}, after {server_after:.0f} µs; "
              f"after / before {server_after / server_before:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
