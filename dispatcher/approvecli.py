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
import re
import sys
from datetime import timedelta
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from dispatcher.cli import EXIT_OK, EXIT_USAGE, _common, _load
from outbox import approvals, db, schema

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhd]?)\s*$")
_UNITS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}


class UsageError(Exception):
    """A usage problem found after parsing (exit 2)."""


def parse_duration(text: str) -> timedelta:
    """``90`` / ``90s`` / ``30m`` / ``2h`` / ``1d`` → a positive timedelta."""
    match = _DURATION.match(text)
    if not match or float(match.group(1)) <= 0:
        raise argparse.ArgumentTypeError(
            f"invalid duration {text!r}: a positive number with s, m, h or d (e.g. 30m)"
        )
    return timedelta(seconds=float(match.group(1)) * _UNITS[match.group(2)])


def resolve_tenant(conn: Connection, given: str | None) -> str:
    """``given``, or the only tenant that has operations; else a :class:`UsageError`."""
    if given:
        return given
    ops = schema.operations
    tenants = conn.execute(sa.select(ops.c.tenant_id).distinct().limit(2)).scalars().all()
    if len(tenants) == 1:
        return str(tenants[0])
    if not tenants:
        raise UsageError("no operations in the database; name the tenant with --tenant")
    raise UsageError("several tenants exist; name one with --tenant")


def _run(args: argparse.Namespace, action: Any) -> int:
    cfg = _load(args)
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
    _common(p)
    p.add_argument("operation_id", metavar="OPERATION_ID")
    p.add_argument("--actor", required=True, help="who approves (recorded)")
    p.add_argument("--expires", type=parse_duration, metavar="DURATION",
                   help="validity from now on the database clock: 30m, 2h, 1d (default: none)")
    p.add_argument("--reason", help="why (recorded)")
    p.add_argument("--tenant", help="tenant (default: the only one)")
    p.add_argument("--no-release", dest="release", action="store_false",
                   help="record the approval only: an operation blocked for want of an "
                        "approval stays blocked (by default it is released to pending)")
    p.add_argument("--requeue", action="store_true", help=argparse.SUPPRESS)  # the default
    p.set_defaults(fn=cmd_approve)

    p = sub.add_parser("revoke", help="revoke every live approval of one operation")
    _common(p)
    p.add_argument("operation_id", metavar="OPERATION_ID")
    p.add_argument("--actor", required=True, help="who revokes (recorded)")
    p.add_argument("--reason", required=True, help="why (recorded)")
    p.add_argument("--tenant", help="tenant (default: the only one)")
    p.set_defaults(fn=cmd_revoke)
