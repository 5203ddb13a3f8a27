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

from dispatcher.console.auth import User, hash_password, load_users
from dispatcher.console.server import ConsoleApp, make_server

__all__ = ["ConsoleApp", "User", "hash_password", "load_users", "make_server"]
