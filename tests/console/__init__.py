"""Tests of ``outboxd console``: a real console process on a free loopback port, a real
database, plain HTTP (``http.client``) or headless Chromium. No mocks.

:class:`ConsoleProcess` runs ``outboxd console``; :class:`Client` is a tiny browser
without JavaScript: it keeps cookies, never follows redirects, and can pull the CSRF token
out of a page.
"""

from __future__ import annotations

import http.client
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from html import unescape
from pathlib import Path
from types import TracebackType
from typing import IO, Any
from urllib.parse import urlencode

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from dispatcher.console.auth import hash_password
from outbox import schema
from tests.support.daemon import REPO_ROOT

PASSWORDS = {"alice": "correct horse battery staple", "bob": "tr0ub4dor&3"}
_CSRF = re.compile(r'name="csrf" value="([^"]*)"')


def write_users(directory: Path, scopes: Mapping[str, list[str] | None]) -> Path:
    """A users file: each user's password from :data:`PASSWORDS`, optional tenant scope."""
    lines = []
    for name, tenants in scopes.items():
        lines.append(f"[users.{name}]")
        lines.append(f'password_hash = "{hash_password(PASSWORDS[name])}"')
        if tenants is not None:
            lines.append("tenants = [" + ", ".join(f'"{t}"' for t in tenants) + "]")
        lines.append("")
    path = directory / "console-users.toml"
    path.write_text("\n".join(lines))
    return path


class ConsoleProcess:
    """``outboxd console --config CFG --users USERS --port 0`` as a subprocess."""

    def __init__(self, config: Path, users: Path, *extra: str) -> None:
        self.port_file = config.with_suffix(".console-port")
        self.port_file.unlink(missing_ok=True)
        self.log_path = config.with_suffix(".console.log")
        self._log: IO[bytes] = self.log_path.open("ab")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "dispatcher.cli", "console", "--config", str(config),
             "--users", str(users), "--port", "0", "--port-file", str(self.port_file), *extra],
            stdout=self._log, stderr=subprocess.STDOUT, cwd=REPO_ROOT,
            env={**os.environ, "OUTBOXD_DISPATCHER_LOG_FORMAT": "json"})
        deadline = time.monotonic() + 20
        while not (self.port_file.exists() and self.port_file.read_text().strip()):
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"the console did not start:\n{self.log_text()}")
            time.sleep(0.02)
        self.port = int(self.port_file.read_text())
        self.url = f"http://127.0.0.1:{self.port}"

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            code = self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            code = self.process.wait()
        self._log.close()
        return code

    def __enter__(self) -> ConsoleProcess:
        return self

    def __exit__(self, et: type[BaseException] | None, e: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()


class Client:
    def __init__(self, port: int) -> None:
        self.port = port
        self.cookies: dict[str, str] = {}
        self.csrf = ""
        self.set_cookies: list[str] = []
        """The Set-Cookie headers of the last response."""

    def request(self, method: str, path: str, form: Mapping[str, str] | None = None,
                headers: Mapping[str, str] | None = None) -> tuple[int, dict[str, str], str]:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        body = urlencode(form) if form is not None else None
        sent = {"Host": f"127.0.0.1:{self.port}", **(headers or {})}
        if body is not None:
            sent["Content-Type"] = "application/x-www-form-urlencoded"
        if self.cookies:
            sent["Cookie"] = "; ".join(f"{k}={v}" for k, v in self.cookies.items())
        conn.request(method, path, body=body, headers=sent)
        resp = conn.getresponse()
        text = resp.read().decode()
        self.set_cookies = resp.headers.get_all("Set-Cookie") or []
        for value in self.set_cookies:
            name, _, rest = value.partition("=")
            self.cookies[name] = rest.split(";", 1)[0]
            if "Max-Age=0" in value:
                del self.cookies[name]
        conn.close()
        found = _CSRF.search(text)
        if found and path != "/login":
            self.csrf = unescape(found.group(1))
        return resp.status, {k.lower(): v for k, v in resp.headers.items()}, text

    def get(self, path: str, **query: str) -> tuple[int, dict[str, str], str]:
        return self.request("GET", path + ("?" + urlencode(query) if query else ""))

    def post(self, path: str, form: Mapping[str, str], *, csrf: bool = True,
             **headers: str) -> tuple[int, dict[str, str], str]:
        data = {**form, "csrf": self.csrf} if csrf else dict(form)
        return self.request("POST", path, data, headers)

    def login(self, user: str, password: str | None = None) -> int:
        _, _, page = self.request("GET", "/login")
        nonce = _CSRF.search(page)
        assert nonce is not None
        status, _, _ = self.request("POST", "/login", {
            "csrf": unescape(nonce.group(1)), "user": user,
            "password": PASSWORDS[user] if password is None else password})
        if status == 303:
            self.get("/")  # picks up the session's CSRF token
        return status

    def act(self, tenant: str, operation_id: str, **form: str) -> tuple[int, dict[str, str], str]:
        return self.post("/operation?" + urlencode({"tenant": tenant, "id": operation_id}),
                         form)


def op_path(tenant: str, operation_id: str) -> str:
    return "/operation?" + urlencode({"tenant": tenant, "id": operation_id})


def row(engine: Engine, tenant: str, operation_id: str) -> dict[str, Any]:
    ops = schema.operations
    with engine.connect() as conn:
        found = conn.execute(sa.select(ops).where(
            ops.c.tenant_id == tenant, ops.c.operation_id == operation_id)).mappings().one()
    return dict(found)


def events(engine: Engine, tenant: str, operation_id: str) -> list[dict[str, Any]]:
    ev = schema.events
    with engine.connect() as conn:
        return [dict(r) for r in conn.execute(sa.select(ev).where(
            ev.c.tenant_id == tenant, ev.c.operation_id == operation_id).order_by(ev.c.id)
        ).mappings()]
