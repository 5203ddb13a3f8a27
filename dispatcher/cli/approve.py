"""``outboxd approve`` and ``outboxd revoke``: a named person allows (or withdraws) one
operation's dispatch, bound to its payload as it is now (:mod:`outbox.approvals`).

    outboxd approve OPERATION_ID --actor A [--expires 30m|2h|1d] [--reason R] [--no-release]
    outboxd revoke OPERATION_ID --actor A --reason R

``--tenant T`` defaults to the only tenant in the database; with several, it is required
(exit 2). Both append an ``outbox_events`` row. Exit codes: 0 ok, 1 refused (unknown
operation, nothing to revoke, operation finished), 2 usage or configuration error.
"""

from __future__ import annotations

import argparse
import sys
from datetime import timedelta
from typing import Any

from sqlalchemy.engine import Connection

from dispatcher.cli.common import (
    EXIT_OK,
    EXIT_USAGE,
    UsageError,
    common_options,
    load,
    resolve_tenant,
)
from outbox import approvals, db
from outbox.durations import parse_duration


def _duration(text: str) -> timedelta:
    """argparse's type for ``--expires``: its own message, not argparse's generic one."""
    try:
        return parse_duration(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None

def _run(args: argparse.Namespace, action: Any) -> int:
    cfg = load(args)
    engine = db.create_engine(cfg.database.url, **cfg.database.engine_args())
    try:
        with engine.begin() as conn:
            tenant = resolve_tenant(conn, args.tenant)
            message = action(conn, tenant)
    except UsageError as exc:
        sys.stderr.write(f"outboxd: error: {exc}\n")
        return EXIT_USAGE
    finally:
        engine.dispose()
    print(message)
    return EXIT_OK


def cmd_approve(args: argparse.Namespace) -> int:
    def action(conn: Connection, tenant: str) -> str:
        result = approvals.approve(
            conn, tenant_id=tenant, operation_id=args.operation_id, actor=args.actor,
            expires_in=args.expires, reason=args.reason, release=args.release,
        )
        a = result.approval
        expiry = a.expires_at.isoformat() if a.expires_at else "never"
        return (
            f"approved {a.operation_id} (tenant {tenant}) as approval {a.id} by "
            f"{a.approved_by}; payload {a.payload_hash}; expires {expiry}\n"
            f"{result.next_step()}"
        )

    return _run(args, action)


def cmd_revoke(args: argparse.Namespace) -> int:
    def action(conn: Connection, tenant: str) -> str:
        n = approvals.revoke(conn, tenant_id=tenant, operation_id=args.operation_id,
                             actor=args.actor, reason=args.reason)
        return f"revoked {n} approval(s) of {args.operation_id} (tenant {tenant})"

    return _run(args, action)


def register(sub: argparse._SubParsersAction[Any]) -> None:
    p = sub.add_parser("approve", help="approve one operation's current payload")
    common_options(p)
    p.add_argument("operation_id", metavar="OPERATION_ID")
    p.add_argument("--actor", required=True, help="who approves (recorded)")
    p.add_argument("--expires", type=_duration, metavar="DURATION",
                   help="validity from now on the database clock: 30m, 2h, 1d (default: none)")
    p.add_argument("--reason", help="why (recorded)")
    p.add_argument("--tenant", help="tenant (default: the only one)")
    p.add_argument("--no-release", dest="release", action="store_false",
                   help="record the approval only: an operation blocked for want of an "
                        "approval stays blocked (by default it is released to pending)")
    p.add_argument("--requeue", action="store_true", help=argparse.SUPPRESS)  # the default
    p.set_defaults(fn=cmd_approve)

    p = sub.add_parser("revoke", help="revoke every live approval of one operation")
    common_options(p)
    p.add_argument("operation_id", metavar="OPERATION_ID")
    p.add_argument("--actor", required=True, help="who revokes (recorded)")
    p.add_argument("--reason", required=True, help="why (recorded)")
    p.add_argument("--tenant", help="tenant (default: the only one)")
    p.set_defaults(fn=cmd_revoke)
