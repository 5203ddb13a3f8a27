"""``outboxd console``: serve the operator console (see docs/console.md).

    outboxd console --config FILE [--host 127.0.0.1] [--port 8080] [--users USERS.toml]
                    [--secure-cookies] [--port-file PATH]
    outboxd console --hash-password < password      # prints a scrypt hash for USERS.toml

The users file comes from ``--users`` or the variable ``OUTBOXD_CONSOLE_USERS``; without
one (or with no user in it) the console refuses to start (exit 2). It binds to 127.0.0.1
unless told otherwise and stops on SIGTERM/SIGINT with exit 0.
"""

from __future__ import annotations

import argparse
import getpass
import os
import sys
from typing import Any

from dispatcher.cli.common import EXIT_OK, EXIT_USAGE, common_options, load
from outbox.errors import ConfigError


def _hash(args: argparse.Namespace) -> int:
    from dispatcher.console.auth import hash_password

    if sys.stdin.isatty():
        password = getpass.getpass("password: ")
    else:
        password = sys.stdin.readline().rstrip("\r\n")
    if not password:
        sys.stderr.write("outboxd: error: empty password\n")
        return EXIT_USAGE
    print(hash_password(password))
    return EXIT_OK


def _needs_the_console_extra() -> None:
    """The console's own dependencies (Jinja2) come with ``outboxd[console]``: without
    them, one line saying so (exit 2), not a traceback."""
    try:
        import dispatcher.console  # noqa: F401
    except ModuleNotFoundError as exc:
        if (exc.name or "").partition(".")[0] != "jinja2":
            raise
        raise ConfigError("outboxd console needs the console extra: "
                          "pip install 'outboxd[console]'") from None


def cmd_console(args: argparse.Namespace) -> int:
    _needs_the_console_extra()
    if args.hash_password:
        return _hash(args)
    from dispatcher.console import ConsoleApp, load_users, serve
    from dispatcher.console.auth import USERS_ENV

    cfg = load(args)
    users_file = args.users or os.environ.get(USERS_ENV)
    if not users_file:
        sys.stderr.write(f"outboxd: error: give --users FILE or set {USERS_ENV}: the console "
                         "never runs without authentication\n")
        return EXIT_USAGE
    users = load_users(users_file)  # ConfigError -> exit 2 in dispatcher.cli.main
    return serve(ConsoleApp(cfg, users, secure_cookies=args.secure_cookies), args.host,
                 args.port, port_file=args.port_file)


def register(sub: argparse._SubParsersAction[Any]) -> None:
    p = sub.add_parser(
        "console", help="serve the operator web console (off unless run; loopback by default)",
        description="Serve the operator console: overview, operations, timelines, recovery "
        "plans and audited actions. See docs/console.md.")
    common_options(p)
    p.add_argument("--host", default="127.0.0.1",
                   help="bind address (default 127.0.0.1; anything else exposes it)")
    p.add_argument("--port", type=int, default=8080, help="port (default 8080; 0: a free one)")
    p.add_argument("--users", metavar="FILE",
                   help="users file (TOML [users.NAME] with password hashes); "
                   "default: $OUTBOXD_CONSOLE_USERS")
    p.add_argument("--secure-cookies", action="store_true",
                   help="mark cookies Secure (when served behind TLS)")
    p.add_argument("--port-file", metavar="PATH", help="write the bound port here")
    p.add_argument("--hash-password", action="store_true",
                   help="read a password from stdin, print its hash for the users file, exit")
    p.set_defaults(fn=cmd_console)
