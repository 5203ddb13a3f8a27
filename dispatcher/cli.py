"""``outboxd``: the command line. Exit codes: 0 ok, 1 operational failure, 2 usage or
configuration error. Every verb takes ``--config FILE``."""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from collections.abc import Callable, Sequence

from sqlalchemy.exc import DBAPIError

from dispatcher.config import Config, load_config
from outbox.db import connect_failure
from outbox.errors import ConfigError, OutboxError

log = logging.getLogger("outboxd.cli")

EXIT_OK, EXIT_FAILURE, EXIT_USAGE = 0, 1, 2


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        self.print_usage(sys.stderr)
        sys.stderr.write(f"outboxd: error: {message}\n")
        raise SystemExit(EXIT_USAGE)


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--config", metavar="FILE", help="TOML configuration (default: ./outboxd.toml if present)"
    )


def _load(args: argparse.Namespace) -> Config:
    cfg = load_config(args.config)
    from dispatcher import logs

    logs.setup(cfg.dispatcher.log_level, cfg.dispatcher.log_format)
    return cfg


def cmd_migrate(args: argparse.Namespace) -> int:
    from outbox import db, migrate

    cfg = _load(args)
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
    from dispatcher.daemon import Daemon

    cfg = _load(args)
    daemon = Daemon(cfg)
    daemon.install_signal_handlers()
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

    cfg = _load(args)
    report = collect(cfg)
    if args.json:
        print(json.dumps(report, indent=2, default=str))
    else:
        print(render(report))
    return EXIT_OK


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="outboxd",
        description=(
            "A transactional outbox dispatcher: external effects without repeats or losses, "
            "and 'unknown' with evidence when nobody can know."
        ),
    )
    sub = parser.add_subparsers(dest="verb", required=True, parser_class=_Parser)

    p = sub.add_parser("migrate", help="create or upgrade the outbox tables")
    _common(p)
    p.add_argument("--sql", action="store_true", help="print the DDL instead of applying it")
    p.set_defaults(fn=cmd_migrate)

    p = sub.add_parser("run", help="run the dispatcher (the sidecar daemon)")
    _common(p)
    p.add_argument("--once", action="store_true", help="drain what is due now, then exit")
    p.set_defaults(fn=cmd_run)

    p = sub.add_parser(
        "sim", help="run the fault-injecting receiver (see `outboxd sim --help`)", add_help=False
    )
    p.add_argument("sim_args", nargs=argparse.REMAINDER)
    p.set_defaults(fn=cmd_sim)

    p = sub.add_parser("status", help="counts by status, oldest pending, unknown and blocked")
    _common(p)
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(fn=cmd_status)

    for extra in _extensions:
        extra(sub)
    return parser


#: Other modules add verbs here (operator commands, demo, purge).
_extensions: list[Callable[[argparse._SubParsersAction[_Parser]], None]] = []


def _load_extensions() -> None:
    import importlib

    for module in (
        "dispatcher.opscli",
        "dispatcher.demo_cli",
        "dispatcher.purge_cli",
        "dispatcher.approvecli",
        "dispatcher.console_cli",
    ):
        try:
            mod = importlib.import_module(module)
        except ModuleNotFoundError as exc:
            if exc.name != module:
                raise
            continue
        _extensions.append(mod.register)


def main(argv: Sequence[str] | None = None) -> int:
    if not _extensions:
        _load_extensions()
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


if __name__ == "__main__":
    raise SystemExit(main())
