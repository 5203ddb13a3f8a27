"""``outboxd purge [--dry-run]`` and ``outboxd erase --tenant T``: the retention path from
the command line (a verb of :mod:`dispatcher.cli.main`).

Both print their counts as JSON. On PostgreSQL run them as a member of the retention
role (``[database] retention_role``). See docs/security-model.md.
"""

from __future__ import annotations

import argparse
import getpass
import json
from typing import Any

from dispatcher.cli import common as cli
from dispatcher.maintenance.retention import RetentionJob
from dispatcher.store import store_for
from outbox import db


def _engine(args: argparse.Namespace) -> tuple[Any, Any]:
    cfg = cli.load(args)
    engine = db.create_engine(cfg.database.url, **cfg.database.engine_args())
    return cfg, engine


def cmd_purge(args: argparse.Namespace) -> int:
    cfg, engine = _engine(args)
    try:
        counts = RetentionJob(engine, cfg.retention).run_once(dry_run=args.dry_run)
    finally:
        engine.dispose()
    if counts is None:
        print(json.dumps({"skipped": "another purge holds the cluster lock"}))
        return cli.EXIT_FAILURE
    print(json.dumps(counts.as_dict(), indent=2))
    return cli.EXIT_OK


def cmd_erase(args: argparse.Namespace) -> int:
    _, engine = _engine(args)
    try:
        with engine.begin() as conn:
            counts = store_for(engine.dialect.name).erase_tenant(
                conn, args.tenant, actor=args.actor, reason=args.reason, dry_run=args.dry_run)
    finally:
        engine.dispose()
    print(json.dumps(counts.as_dict(), indent=2))
    return cli.EXIT_OK


def _default_actor() -> str:
    try:
        return getpass.getuser()
    except Exception:  # no user name in this environment
        return "operator"


def register(sub: Any) -> None:
    p = sub.add_parser("purge", help="apply the [retention] periods once (see --dry-run)")
    cli.common_options(p)
    p.add_argument("--dry-run", action="store_true", help="count what would go; change nothing")
    p.set_defaults(fn=cmd_purge)

    p = sub.add_parser(
        "erase", help="remove one tenant's payloads and personal data, keep minimised evidence"
    )
    cli.common_options(p)
    p.add_argument("--tenant", required=True, help="the tenant to erase")
    p.add_argument("--actor", default=_default_actor(), help="who asks (default: $USER)")
    p.add_argument("--reason", default="erasure request", help="why (recorded in the event)")
    p.add_argument("--dry-run", action="store_true", help="count what would go; change nothing")
    p.set_defaults(fn=cmd_erase)
