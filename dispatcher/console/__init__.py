"""``outboxd console``: a small web page for what needs a person.

Unknown and blocked operations, their evidence (attempts, events, approvals, fencing
tokens, the provider's declared capabilities and its dedup window), each task's recovery
plan, and the audited actions the CLI has (approve, revoke, resolve, requeue, cancel,
reveal a payload) with the logged-in user as the actor. Server-rendered HTML (stdlib HTTP
server, Jinja2 with autoescaping), no JavaScript. Off unless the verb is run; bound to
127.0.0.1 by default; see docs/console.md.

Modules: :mod:`.auth` (users, password hashes, sessions, CSRF), :mod:`.views` (what each
page reads), :mod:`.actions` (the audited writes), :mod:`.render` (templates),
:mod:`.server` (routing and the HTTP server).
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path

from dispatcher.console.auth import User, hash_password, load_users
from dispatcher.console.server import ConsoleApp, make_server
from outbox.stop_signals import StopSignals

__all__ = ["ConsoleApp", "User", "hash_password", "load_users", "make_server", "serve"]
log = logging.getLogger("outboxd.console")
EXIT_OK, EXIT_USAGE = 0, 2


def serve(app: ConsoleApp, host: str, port: int, *, port_file: str | None = None) -> int:
    """Bind, serve until SIGTERM or SIGINT, close ``app``; the process exit code.

    ``port`` 0 picks a free port; ``port_file`` receives the bound port (for tests and
    supervisors). A port that cannot be bound is a usage error (2)."""
    try:
        server = make_server(app, host, port)
    except OSError as exc:
        app.close()
        sys.stderr.write(f"outboxd: error: cannot listen on {host}:{port}: {exc.strerror}\n")
        return EXIT_USAGE
    bound = server.server_address[1]
    if port_file:
        Path(port_file).write_text(f"{bound}\n")
    log.info("console listening on http://%s:%s/", host, bound, extra={"port": bound})

    # server.shutdown() waits for serve_forever to return, so it is called from the
    # signal watcher's thread (see outbox.stop_signals), never from a handler
    with StopSignals(lambda _name: server.shutdown()):
        try:
            server.serve_forever(poll_interval=0.2)
        finally:
            server.server_close()
            app.close()
    return EXIT_OK
