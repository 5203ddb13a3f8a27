"""The backlog section of ``make bench`` on its own, repeated: does a large backlog slow the
drain?

Run as ``python -m bench.backlog [--sizes 10000,1000000] [--pairs 3] [--seconds 10]``. Each
run is a fresh scratch PostgreSQL database holding ``size`` pending operations staged with
plain SQL, settled (``VACUUM (ANALYZE)``, ``CHECKPOINT``: ``bench.daemon_runs.settle``),
the claim's latency measured, then one ``outboxd run`` (null provider, batch 100) timed for
``--seconds`` or until drained. The sizes alternate (small, large, small, large, ...) so a
machine that drifts weighs on both; prints each run, then the sums' ratio of each size to
the first.
"""

from __future__ import annotations

import argparse

from bench import daemon_runs as d


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.backlog", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="10000,1000000",
                    help="backlogs to compare, the first the base (default: 10000,1000000)")
    ap.add_argument("--pairs", type=int, default=3, help="runs of each size (default: 3)")
    ap.add_argument("--seconds", type=float, default=10.0,
                    help="longest timed drain of one run (default: 10)")
    args = ap.parse_args(argv)
    sizes = [int(x) for x in args.sizes.split(",")]
    rates: dict[int, list[float]] = {size: [] for size in sizes}
    for _ in range(args.pairs):
        for size in sizes:
            latency, rate = d.backlog(size, args.seconds)
            rates[size].append(rate)
            print(f"{size:>10,} pending: claim {latency:5.2f} ms, {rate:,.0f} rows/s", flush=True)
    base = sum(rates[sizes[0]])
    for size in sizes[1:]:
        print(f"{size:,} / {sizes[0]:,} pending: {sum(rates[size]) / base:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
