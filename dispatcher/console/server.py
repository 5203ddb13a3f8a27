"""The console's HTTP side: stdlib ``ThreadingHTTPServer``, Jinja2 templates with
autoescaping, no JavaScript. :class:`ConsoleApp` maps a request to a response (routing,
sessions, CSRF, tenant scope); :func:`make_server` binds it.

Routes: ``GET /login`` ``POST /login`` ``POST /logout`` · ``GET /`` (overview) ·
``GET /operations`` (filters, keyset pages) · ``GET /operation?tenant=T&id=OP`` (timeline)
and ``POST`` there (actions) · ``GET /task?tenant=T&id=TASK`` (recovery plan) ·
``GET /static/console.css``. Without a session a page redirects to ``/login`` and a POST
is 401; a POST without the session's CSRF token (or from another origin) is 403; another
tenant's operation or task is 404.
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from http.cookies import SimpleCookie
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlencode, urlsplit

import jinja2
import sqlalchemy as sa

from dispatcher.config import Config
from dispatcher.console import actions, views
from dispatcher.console.auth import Session, Sessions, User, csrf_ok
from dispatcher.console.render import make_environment
from outbox import db, errors, recovery
from outbox.states import OperationStatus
from providers.registry import build_provider, close_providers

log = logging.getLogger("outboxd.console")
HERE = Path(__file__).parent
COOKIE, LOGIN_COOKIE = "outboxd_console", "outboxd_console_login"
MAX_BODY = 64 * 1024
HEADERS = {
    "Content-Security-Policy": "default-src 'none'; style-src 'self'; img-src 'self'; "
    "form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}


@dataclass
class Request:
    method: str
    path: str
    query: dict[str, str]
    headers: Mapping[str, str]
    body: bytes = b""

    def form(self) -> dict[str, str]:
        return {k: v[0] for k, v in parse_qs(self.body.decode("utf-8", "replace"),
                                             keep_blank_values=True).items()}

    def cookie(self, name: str) -> str | None:
        jar: SimpleCookie = SimpleCookie()
        try:
            jar.load(self.headers.get("Cookie", ""))
        except Exception:
            return None
        return jar[name].value if name in jar else None


@dataclass
class Response:
    status: int
    body: bytes = b""
    content_type: str = "text/html; charset=utf-8"
    headers: list[tuple[str, str]] = field(default_factory=list)


def redirect(location: str, *cookies: str) -> Response:
    return Response(303, headers=[("Location", location), *(("Set-Cookie", c) for c in cookies)])


class ConsoleApp:
    def __init__(self, cfg: Config, users: Mapping[str, User], *,
                 secure_cookies: bool = False) -> None:
        self.cfg = cfg
        self.engine = db.create_engine(cfg.database.url, schema=cfg.database.schema)
        self.sessions = Sessions(users)
        self.secure = secure_cookies
        self.env: jinja2.Environment = make_environment(HERE / "templates")
        self._providers: dict[str, views.ProviderView] = {}
        self._built: dict[str, Any] = {}

    def close(self) -> None:
        close_providers(self._built)
        self.engine.dispose()

    # -- plumbing ---------------------------------------------------------------------

    def _cookie(self, name: str, value: str, *, max_age: int | None = None) -> str:
        parts = [f"{name}={value}", "Path=/", "HttpOnly", "SameSite=Strict"]
        if max_age is not None:
            parts.append(f"Max-Age={max_age}")
        if self.secure:
            parts.append("Secure")
        return "; ".join(parts)

    def page(self, name: str, status: int = 200, session: Session | None = None,
             **context: Any) -> Response:
        flash = list(session.flash) if session else []
        if session:
            session.flash.clear()
        html = self.env.get_template(name).render(
            user=session.user if session else None, csrf=session.csrf if session else "",
            flash=flash, **context)
        return Response(status, html.encode())

    def provider(self, name: str) -> views.ProviderView | None:
        """The configured provider's declared capabilities (built once), or None."""
        if name not in self.cfg.providers:
            return None
        if name not in self._providers:
            try:
                built = build_provider(name, self.cfg.providers[name])
                self._built[name] = built
                self._providers[name] = views.ProviderView(built.capabilities)
            except Exception as exc:  # a provider the console cannot build is still shown
                self._providers[name] = views.ProviderView(None, type(exc).__name__)
        return self._providers[name]

    # -- dispatch ---------------------------------------------------------------------

    def handle(self, req: Request) -> Response:
        try:
            return self._route(req)
        except views.NotFound:
            return Response(404, b"not found", "text/plain; charset=utf-8")
        except sa.exc.SQLAlchemyError as exc:  # the class only: messages may quote SQL
            log.warning("console: database error", extra={"error": type(exc).__name__})
            return Response(503, b"database unavailable", "text/plain; charset=utf-8")

    def _route(self, req: Request) -> Response:
        if req.path == "/static/console.css":
            return Response(200, (HERE / "templates" / "console.css").read_bytes(),
                            "text/css; charset=utf-8")
        if req.path == "/login":
            return self._login(req)
        session = self.sessions.get(req.cookie(COOKIE))
        if session is None:
            if req.method == "POST":
                return Response(401, b"log in first", "text/plain; charset=utf-8")
            return redirect("/login")
        if req.method == "POST":
            origin = req.headers.get("Origin")
            if origin and origin != "null" and urlsplit(origin).netloc != req.headers.get(
                    "Host"):
                return Response(403, b"cross-origin request refused", "text/plain")
            form = req.form()
            if not csrf_ok(session, form.get("csrf")):
                return Response(403, b"missing or invalid CSRF token", "text/plain")
            return self._post(req, session, form)
        routes: dict[str, Callable[[Request, Session], Response]] = {
            "/": self._overview, "/operations": self._list, "/operation": self._operation,
            "/task": self._task}
        if req.path in routes and req.method == "GET":
            return routes[req.path](req, session)
        return Response(404, b"not found", "text/plain; charset=utf-8")

    def _login(self, req: Request) -> Response:
        # Login CSRF: double submit. The browser keeps one random login cookie (reused
        # while present, so a page fetched twice still matches) and the form echoes it.
        given = req.cookie(LOGIN_COOKIE)
        nonce = given if given and len(given) >= 32 else secrets.token_urlsafe(24)
        if req.method == "GET":
            resp = self.page("login.html", nonce=nonce, error=None)
            resp.headers.append(("Set-Cookie", self._cookie(LOGIN_COOKIE, nonce)))
            return resp
        form = req.form()
        if not given or not secrets.compare_digest(given, form.get("csrf", "")):
            return Response(403, b"missing or invalid CSRF token", "text/plain")
        name = form.get("user", "").strip()
        cookie = self.sessions.login(name, form.get("password", ""))
        if cookie is None:
            log.warning("console: login refused", extra={"reason": "bad credentials"})
            return self.page("login.html", 401, nonce=nonce, error="wrong user or password")
        log.info("console: %s logged in", name)
        return redirect("/", self._cookie(COOKIE, cookie),
                        self._cookie(LOGIN_COOKIE, "", max_age=0))

    def _post(self, req: Request, session: Session, form: dict[str, str]) -> Response:
        if req.path == "/logout":
            self.sessions.logout(req.cookie(COOKIE))
            return redirect("/login", self._cookie(COOKIE, "", max_age=0))
        if req.path != "/operation":
            return Response(404, b"not found", "text/plain; charset=utf-8")
        tenant, op_id = req.query.get("tenant", ""), req.query.get("id", "")
        scope = session.user.tenants
        if scope is not None and tenant not in scope:
            raise views.NotFound(op_id)
        back = "/operation?" + urlencode({"tenant": tenant, "id": op_id})
        try:
            done = actions.perform(self.engine, session.user.name, tenant, op_id, form)
        except actions.Refused as exc:
            session.flash.append(("error", f"{form.get('action', 'action')} refused: {exc}"))
            return redirect(back)
        if form.get("action") == "reveal":
            return self.page("revealed.html", session=session, tenant=tenant, op_id=op_id,
                             payload=done.revealed, message=done.message)
        session.flash.append(("ok", done.message))
        return redirect(back)

    # -- pages ------------------------------------------------------------------------

    def _overview(self, req: Request, s: Session) -> Response:
        with self.engine.begin() as conn:
            data = views.overview(conn, s.user.tenants)
        return self.page("overview.html", session=s, **data)

    def _list(self, req: Request, s: Session) -> Response:
        filters = {k: req.query.get(k, "").strip() for k in views.LIST_FILTERS}
        if s.user.tenants is not None and filters["tenant"] and not s.user.sees(
                filters["tenant"]):
            filters["tenant"] = "\0"  # matches nothing: an out-of-scope tenant is empty
        before = req.query.get("before", "")
        older = req.query.get("older_than", "").strip()
        error = None
        older_seconds = None
        if older:
            try:
                older_seconds = actions.parse_duration(older).total_seconds()
            except Exception:
                error = "older than: a duration such as 30s, 10m, 2h or 1d"
        with self.engine.begin() as conn:
            rows, next_before = views.list_operations(
                conn, s.user.tenants, filters,
                before=int(before) if before.isdigit() else None, older_than=older_seconds)
        filters["tenant"] = filters["tenant"].replace("\0", req.query.get("tenant", ""))
        query = {k: v for k, v in {**filters, "older_than": older}.items() if v}
        return self.page("operations.html", session=s, rows=rows, filters=filters,
                         older_than=older, error=error, next_before=next_before,
                         query=query, statuses=[st.value for st in OperationStatus])

    def _operation(self, req: Request, s: Session) -> Response:
        tenant, op_id = req.query.get("tenant", ""), req.query.get("id", "")
        if not s.user.sees(tenant):
            raise views.NotFound(op_id)
        with self.engine.begin() as conn:
            provider_name = conn.execute(
                sa.select(views.ops.c.provider).where(
                    views.ops.c.tenant_id == tenant, views.ops.c.operation_id == op_id)
            ).scalar()
            provider = self.provider(provider_name) if provider_name else None
            data = views.operation(conn, s.user.tenants, tenant, op_id, provider=provider,
                                   margin=self.cfg.dispatcher.dedup_safety_margin)
        log.info("console: %s viewed operation evidence", s.user.name,
                 extra={"tenant": tenant, "operation_id": op_id})
        return self.page("operation.html", session=s, tenant=tenant, **data)

    def _task(self, req: Request, s: Session) -> Response:
        tenant, task_id = req.query.get("tenant", ""), req.query.get("id", "")
        views.task_in_scope(s.user.tenants, tenant, task_id)
        try:
            with self.engine.begin() as conn:
                plan = recovery.plan(conn, tenant_id=tenant, task_id=task_id)
        except errors.TaskNotFound:
            raise views.NotFound(task_id) from None
        log.info("console: %s viewed task plan", s.user.name,
                 extra={"tenant": tenant, "task_id": task_id})
        return self.page("task.html", session=s, plan=plan)


def make_server(app: ConsoleApp, host: str, port: int) -> ThreadingHTTPServer:
    class Handler(BaseHTTPRequestHandler):
        server_version = "outboxd-console"
        sys_version = ""

        def _serve(self, method: str) -> None:
            url = urlsplit(self.path)
            length = int(self.headers.get("Content-Length") or 0)
            if length > MAX_BODY:
                self._write(Response(413, b"request too large", "text/plain"))
                return
            body = self.rfile.read(length) if length else b""
            query = {k: v[0] for k, v in parse_qs(url.query, keep_blank_values=True).items()}
            headers = dict(self.headers.items())
            self._write(app.handle(Request(method, url.path, query, headers, body)))

        def do_GET(self) -> None:
            self._serve("GET")

        def do_POST(self) -> None:
            self._serve("POST")

        def _write(self, resp: Response) -> None:
            self.send_response(resp.status)
            for name, value in {**HEADERS, "Content-Type": resp.content_type}.items():
                self.send_header(name, value)
            for name, value in resp.headers:
                self.send_header(name, value)
            self.send_header("Content-Length", str(len(resp.body)))
            self.end_headers()
            self.wfile.write(resp.body)

        def log_message(self, format: str, *args: Any) -> None:
            log.debug("console: %s", format % args)

    server = ThreadingHTTPServer((host, port), Handler)
    server.daemon_threads = True
    return server
