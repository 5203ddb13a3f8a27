"""``python -m tests.chaos.soak``: the seeded chaos soak (``make soak``).

    python -m tests.chaos.soak --operations 100000 --seed 1 --dialect postgres
    python -m tests.chaos.soak --seed 7 --dialect sqlite --operations 2000 --control

Fault counts scale with ``--fault-seconds`` unless given. Prints a summary (seed, the
command that replays the schedule, every figure) and writes the full report as JSON next
to the run's work directory; exits 1 when an invariant is violated (the seed is printed
first), 0 otherwise. Without ``--operations`` it runs the documented soak.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from tests.chaos.nemesis import ChaosConfig, dump, git_commit, run

# The documented soak (docs/reliability.md): what fits in about ten minutes on the
# two-core reference machine. The full soak figures need a longer run, e.g.
# --operations 100000 --fault-seconds 3600 (see docs/reliability.md).
DEFAULT_OPERATIONS = 4_000
DEFAULT_FAULT_SECONDS = 180.0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m tests.chaos.soak", description=__doc__)
    p.add_argument("--operations", type=int, default=DEFAULT_OPERATIONS)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--dialect", choices=("postgres", "sqlite"), default="postgres")
    p.add_argument("--fault-seconds", type=float, default=None,
                   help="length of the fault phase (default: scaled to --operations)")
    p.add_argument("--replicas", type=int, default=3)
    p.add_argument("--kills", type=int, default=None)
    p.add_argument("--pauses", type=int, default=None)
    p.add_argument("--db-restarts", type=int, default=None)
    p.add_argument("--lease-seconds", type=float, default=1.0,
                   help="the replicas' lease; a pause lasts the lease plus 0.1-0.3 s")
    p.add_argument("--revocations", type=int, default=None,
                   help="approval revocations mid-flight (default: scaled)")
    p.add_argument("--control", action="store_true",
                   help="the receiver ignores keys: duplicates are expected and must be seen")
    p.add_argument("--min-failpoint-hits", type=int, default=5)
    p.add_argument("--workdir", type=Path, default=None)
    p.add_argument("--keep", action="store_true", help="keep the work directory on success")
    p.add_argument("--quiet", action="store_true")
    return p


def config_from(args: argparse.Namespace) -> ChaosConfig:
    seconds = args.fault_seconds
    if seconds is None:
        seconds = DEFAULT_FAULT_SECONDS * args.operations / DEFAULT_OPERATIONS
        seconds = max(20.0, seconds)
    scale = seconds / 60.0
    sqlite = args.dialect == "sqlite"
    return ChaosConfig(
        seed=args.seed,
        dialect=args.dialect,
        operations=args.operations,
        replicas=args.replicas,
        fault_seconds=seconds,
        kills=args.kills if args.kills is not None else round(12 * scale),
        pauses=args.pauses if args.pauses is not None else round(40 * scale),
        db_restarts=0 if sqlite else (args.db_restarts if args.db_restarts is not None
                                      else max(2, round(3 * scale))),
        pg_terminates=0 if sqlite else round(6 * scale),
        proxy_faults=0 if sqlite else round(12 * scale),
        sim_bursts=round(8 * scale),
        prunes=round(10 * scale),
        cancels=round(8 * scale),
        revocations=(args.revocations if args.revocations is not None
                     else round(10 * scale)),
        lease_seconds=args.lease_seconds,
        control=args.control,
        min_failpoint_hits=0 if args.control else args.min_failpoint_hits,
        drain_timeout=max(120.0, seconds),
        workdir=str(args.workdir) if args.workdir else None,
        keep=args.keep,
        verbose=not args.quiet,
    )


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    cfg = config_from(args)
    print(f"chaos soak seed={cfg.seed} dialect={cfg.dialect} operations={cfg.operations}"
          f" fault_seconds={cfg.fault_seconds:g} commit={git_commit()}", flush=True)
    print(f"reproduce: {cfg.command()}", flush=True)
    report = run(cfg)
    print(report.summary(), flush=True)
    out = Path(report.workdir).with_suffix(".report.json") if report.workdir else None
    if out is not None:
        out.write_text(dump(report))
        print(f"report: {out}")
    if not report.ok:
        print(f"FAILED: seed {cfg.seed}; reproduce with: {cfg.command()}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
