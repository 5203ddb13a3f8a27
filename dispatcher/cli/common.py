"""What every verb shares: exit codes, the argument parser, ``--config`` and loading it,
and the tenant a verb acts for."""

from __future__ import annotations

import argparse
import sys

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from dispatcher.config import Config, load_config
from outbox import schema

EXIT_OK, EXIT_FAILURE, EXIT_USAGE = 0, 1, 2


class Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        self.print_usage(sys.stderr)
        sys.stderr.write(f"outboxd: error: {message}\n")
        raise SystemExit(EXIT_USAGE)


def common_options(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--config", metavar="FILE", help="TOML configuration (default: ./outboxd.toml if present)"
    )


def load(args: argparse.Namespace) -> Config:
    cfg = load_config(args.config)
    from dispatcher.observability import logs

    logs.setup(cfg.dispatcher.log_level, cfg.dispatcher.log_format)
    return cfg



class UsageError(Exception):
    """A usage problem found after parsing (exit 2)."""


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

