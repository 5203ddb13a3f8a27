"""The ``outboxd demo`` verb (a verb of :mod:`dispatcher.cli.main`)."""

from __future__ import annotations

import argparse
from typing import Any


def _positive(text: str) -> int:
    value = int(text)
    if value < 10 or value > 5000:
        raise argparse.ArgumentTypeError("between 10 and 5000")
    return value


def cmd_demo(args: argparse.Namespace) -> int:
    from dispatcher import demo

    return demo.main(operations=args.operations, seed=args.seed, keep=args.keep)


def register(sub: argparse._SubParsersAction[Any]) -> None:
    p = sub.add_parser(
        "demo",
        help="the whole promise on a temporary SQLite database: faults, two SIGKILLs, a summary",
        description=(
            "Start the fault-injecting sim, stage operations through outbox.advance, run the "
            "dispatcher, SIGKILL it twice mid-run, approve what waits for approval, and print "
            "a summary. Exit 0 when there is no duplicate and nothing is lost."
        ),
    )
    p.add_argument("--keep", action="store_true",
                   help="keep the database, configuration and logs, and print their paths")
    p.add_argument("--operations", type=_positive, default=300, metavar="N",
                   help="how many operations the example agent stages (default 300)")
    p.add_argument("--seed", type=int, default=None,
                   help="make the agent's choices and the receiver's faults reproducible")
    p.set_defaults(fn=cmd_demo)
