"""``outboxd``: the command line's entry point, its own verbs (migrate, run, status, sim,
...) and the table of the others (:data:`VERBS`). Exit codes: 0 ok, 1 operational failure,
2 usage or configuration error. Every verb takes ``--config FILE``."""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from collections.abc import Callable, Sequence

from sqlalchemy.exc import DBAPIError

from dispatcher.cli import approve, console, demo, ops, purge
from dispatcher.cli.common import (
    EXIT_FAILURE,
    EXIT_OK,
    EXIT_USAGE,
    Parser,
    common_options,
    load,
)
from outbox.db import connect_failure
from outbox.errors import ConfigError, OutboxError

log = logging.getLogger("outboxd.cli")


def cmd_migrate(args: argparse.Namespace) -> int:
    from outbox import db, migrate

    cfg = load(args)
    if args.sql:
        sys.stdout.write(migrate.sql_script(cfg.database.url, cfg.database.schema))
        return EXIT_OK
    engine = db.create_engine(cfg.database.url, **cfg.database.engine_args())
    try:
        before = migrate.current(engine, cfg.database.schema)
        d = cfg.database
        roles = {"agent": d.agent_role, "dispatcher": d.dispatcher_role,
                 "operator": d.operator_role, "retention": d.retention_role}
        reached = migrate.upgrade(engine, d.schema, roles=roles)
    finally:
        engine.dispose()
    print(f"database at revision {reached}" + ("" if before == reached else f" (was {before})"))
    return EXIT_OK


def cmd_run(args: argparse.Namespace) -> int:
    from dispatcher.daemon import Daemon, settle_heap

    cfg = load(args)
    daemon = Daemon(cfg)
    daemon.install_signal_handlers()
    settle_heap()
    code = daemon.run(once=args.once)
    if daemon.worker.in_flight():
        # Sends still in flight after the grace period: their pool threads would hold the
        # interpreter's exit until each request times out. Their rows stay `dispatching`
        # under a lease, which recovery and reconciliation settle: leave now.
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    return code


def cmd_sim(args: argparse.Namespace) -> int:
    from providers.sim.cli import main as sim_main

    return sim_main(args.sim_args)


def cmd_status(args: argparse.Namespace) -> int:
    from dispatcher.status import collect, render

    cfg = load(args)
    report = collect(cfg)
    if args.json:
        print(json.dumps(report, indent=2, default=str))
    else:
        print(render(report))
    return EXIT_OK


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="outboxd",
        description=(
            "A transactional outbox dispatcher: external effects without repeats or losses, "
            "and 'unknown' with evidence when nobody can know."
        ),
    )
    sub = parser.add_subparsers(dest="verb", required=True, parser_class=Parser)

    p = sub.add_parser("migrate", help="create or upgrade the outbox tables")
    common_options(p)
    p.add_argument("--sql", action="store_true", help="print the DDL instead of applying it")
    p.set_defaults(fn=cmd_migrate)

    p = sub.add_parser("run", help="run the dispatcher (the sidecar daemon)")
    common_options(p)
    p.add_argument("--once", action="store_true", help="drain what is due now, then exit")
    p.set_defaults(fn=cmd_run)

    p = sub.add_parser(
        "sim", help="run the fault-injecting receiver (see `outboxd sim --help`)", add_help=False
    )
    p.add_argument("sim_args", nargs=argparse.REMAINDER)
    p.set_defaults(fn=cmd_sim)

    p = sub.add_parser("status", help="counts by status, oldest pending, unknown and blocked")
    common_options(p)
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(fn=cmd_status)

    for register in VERBS:
        register(sub)
    return parser


#: The verbs other modules define, in the order ``--help`` lists them: each module's
#: ``register`` adds its sub-commands. An explicit table: a module that fails to import
#: fails the command line, never silently removes its verb.
VERBS: tuple[Callable[[argparse._SubParsersAction[Parser]], None], ...] = (
    ops.register,
    demo.register,
    purge.register,
    approve.register,
    console.register,
)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["sim"]:  # the sim parses its own flags
        from providers.sim.cli import main as sim_main

        return sim_main(argv[1:])
    args = build_parser().parse_args(argv)
    try:
        code = args.fn(args)
        return int(code)
    except ConfigError as exc:
        sys.stderr.write(f"outboxd: configuration error: {exc}\n")
        return EXIT_USAGE
    except OutboxError as exc:
        sys.stderr.write(f"outboxd: {exc}\n")
        return EXIT_FAILURE
    except DBAPIError as exc:  # one line: the driver's reason (no SQL, no credentials)
        permanent, reason = connect_failure(exc)
        sys.stderr.write(f"outboxd: database error: {reason}\n")
        return EXIT_USAGE if permanent else EXIT_FAILURE
    except KeyboardInterrupt:
        return EXIT_OK

