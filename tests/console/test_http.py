"""``outboxd console`` over plain HTTP against a real console process and PostgreSQL:
authentication, CSRF, tenant scope, escaping, pagination, and every action writing its
``outbox_events`` row with the logged-in user as the actor."""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Engine

from outbox import db, schema
from outbox.api import StagedOperation, advance
from tests.conftest import drop_pg_database, new_pg_database
from tests.console import Client, ConsoleProcess, events, op_path, row, write_users
from tests.support.daemon import write_config

pytestmark = pytest.mark.postgres
SECRET_VALUE = "<script>alert('payload')</script>"


@dataclass
class Site:
    console: ConsoleProcess
    engine: Engine
    directory: Path

    def client(self, user: str | None = "alice") -> Client:
        c = Client(self.console.port)
        if user is not None:
            assert c.login(user) == 303
        return c


@pytest.fixture(scope="module")
def site(pg_admin_dsn: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Site]:
    directory = tmp_path_factory.mktemp("console")
    url = new_pg_database(pg_admin_dsn)
    cfg = write_config(directory, url, {"sim": {
        "kind": "http", "url": "http://127.0.0.1:9/effects", "dedup_retention_seconds": 3600}})
    users = write_users(directory, {"alice": None, "bob": ["t2"]})
    engine = db.create_engine(url)
    try:
        with ConsoleProcess(cfg, users) as console:
            yield Site(console, engine, directory)
    finally:
        engine.dispose()
        drop_pg_database(pg_admin_dsn, url)


def stage(engine: Engine, tenant: str = "t1", *, status: str | None = None,
          reason: str | None = None, prefix: str = "op", **options: object) -> str:
    """One operation of a new task; ``status``: then set as a dispatcher would have left
    it (test set-up only; the console itself never writes a status)."""
    op_id = f"{prefix}:{uuid.uuid4().hex[:10]}"
    with engine.begin() as conn:
        advance(conn, f"task-{op_id}", tenant_id=tenant, expected_revision=0, phase="staged",
                operations=[StagedOperation(operation_id=op_id, provider="sim",
                                            payload={"note": SECRET_VALUE}, **options)])
        if status is not None:
            ops = schema.operations
            conn.execute(sa.update(ops).where(ops.c.tenant_id == tenant,
                                              ops.c.operation_id == op_id)
                         .values(status=status, status_reason=reason, attempts=1,
                                 last_outcome="ambiguous"))
    return op_id


def overrides_of(engine: Engine, tenant: str, op_id: str) -> list[dict[str, object]]:
    return [e for e in events(engine, tenant, op_id) if e["kind"] != "transition"]


# -- authentication ----------------------------------------------------------------------


def test_without_a_session_pages_redirect_and_posts_are_401(site: Site) -> None:
    op_id = stage(site.engine)
    anon = site.client(None)
    for path in ("/", "/operations", op_path("t1", op_id), f"/task?tenant=t1&id=task-{op_id}"):
        status, headers, _ = anon.request("GET", path)
        assert (status, headers["location"]) == (303, "/login"), path
    status, _, _ = anon.post(op_path("t1", op_id), {"action": "cancel", "reason": "x"},
                             csrf=False)
    assert status == 401
    assert row(site.engine, "t1", op_id)["status"] == "pending"
    assert overrides_of(site.engine, "t1", op_id) == []


def test_a_bad_password_or_unknown_user_is_refused(site: Site) -> None:
    c = site.client(None)
    assert c.login("alice", "wrong password") == 401
    assert c.login("mallory", "correct horse battery staple") == 401
    assert "outboxd_console" not in c.cookies
    assert c.get("/")[0] == 303
    assert c.login("alice") == 303
    status, _, page = c.get("/")
    assert status == 200 and "Overview" in page


def test_session_cookie_is_httponly_and_samesite_strict(site: Site) -> None:
    c = Client(site.console.port)
    _, _, page = c.request("GET", "/login")
    nonce = re.search(r'name="csrf" value="([^"]*)"', page)
    assert nonce is not None
    status, headers, _ = c.request("POST", "/login", {
        "csrf": nonce.group(1), "user": "alice", "password": "correct horse battery staple"})
    assert status == 303
    cookie = next(v for v in c.set_cookies if v.startswith("outboxd_console="))
    assert "HttpOnly" in cookie and "SameSite=Strict" in cookie
    assert "default-src 'none'" in headers["content-security-policy"]


def test_login_without_its_csrf_token_is_403(site: Site) -> None:
    c = Client(site.console.port)
    status, _, _ = c.request("POST", "/login", {"user": "alice", "password": "x"})
    assert status == 403


def test_logout_ends_the_session(site: Site) -> None:
    c = site.client()
    assert c.post("/logout", {})[0] == 303
    assert c.get("/")[0] == 303


# -- CSRF --------------------------------------------------------------------------------


def test_an_action_without_or_with_a_wrong_csrf_token_is_403_and_writes_nothing(
    site: Site,
) -> None:
    op_id = stage(site.engine)
    c = site.client()
    path = op_path("t1", op_id)
    form = {"action": "cancel", "reason": "no token"}
    assert c.post(path, form, csrf=False)[0] == 403
    assert c.post(path, {**form, "csrf": "forged"}, csrf=False)[0] == 403
    other = site.client()  # another session's token is not this session's
    assert c.post(path, {**form, "csrf": other.csrf}, csrf=False)[0] == 403
    assert c.post(path, form, Origin="http://evil.example")[0] == 403
    assert row(site.engine, "t1", op_id)["status"] == "pending"
    assert overrides_of(site.engine, "t1", op_id) == []


# -- tenant scope ------------------------------------------------------------------------


def test_a_tenant_scoped_operator_cannot_open_or_act_on_another_tenants_operation(
    site: Site,
) -> None:
    theirs = stage(site.engine, "t1", status="unknown", reason="lease_expired")
    mine = stage(site.engine, "t2")
    bob = site.client("bob")
    assert bob.get(op_path("t1", theirs))[0] == 404
    assert bob.get("/task", tenant="t1", id=f"task-{theirs}")[0] == 404
    status, _, _ = bob.act("t1", theirs, action="resolve", outcome="applied",
                           reason="guess", evidence="none")
    assert status == 404
    assert row(site.engine, "t1", theirs)["status"] == "unknown"
    _, _, listing = bob.get("/operations", tenant="t1")
    assert theirs not in listing
    _, _, listing = bob.get("/operations")
    assert theirs not in listing and mine in listing
    assert bob.get(op_path("t2", mine))[0] == 200
    assert site.client("alice").get(op_path("t1", theirs))[0] == 200


# -- pages -------------------------------------------------------------------------------


def test_payload_values_are_not_shown_and_everything_is_escaped(site: Site) -> None:
    op_id = stage(site.engine, prefix="<b>x</b>")
    c = site.client()
    status, _, page = c.get("/operation", tenant="t1", id=op_id)
    assert status == 200
    assert "alert(" not in page and "<b>x</b>" not in page
    assert "&lt;b&gt;x&lt;/b&gt;" in page
    assert row(site.engine, "t1", op_id)["payload_digest"] in page
    _, _, listing = c.get("/operations", tenant="t1")
    assert "<b>x</b>" not in listing


def test_the_list_pages_by_keyset_and_filters(site: Site) -> None:
    task_ids = [stage(site.engine, "t3", prefix="page") for _ in range(60)]
    blocked = stage(site.engine, "t3", status="blocked", reason="approval_missing")
    c = site.client()
    _, _, first = c.get("/operations", tenant="t3")
    assert first.count('class="status-') == 50
    nxt = re.search(r'rel="next" href="([^"]+)"', first)
    assert nxt is not None
    _, _, second = c.get(nxt.group(1).replace("&amp;", "&"))
    assert second.count('class="status-') == 11 and 'rel="next"' not in second
    assert task_ids[0] in second and task_ids[0] not in first
    _, _, only = c.get("/operations", tenant="t3", status="blocked", reason="approval_missing")
    assert only.count('class="status-') == 1 and blocked in only
    _, _, none = c.get("/operations", tenant="t3", older_than="1d")
    assert "No operations match" in none


def test_overview_and_recovery_plan(site: Site) -> None:
    op_id = stage(site.engine, "t4", status="unknown", reason="lease_expired")
    c = site.client()
    _, _, page = c.get("/")
    assert "lease_expired" in page and "unknown" in page
    status, _, plan = c.get("/task", tenant="t4", id=f"task-{op_id}")
    assert status == 200 and "reconcile" in plan and op_id in plan


# -- actions -----------------------------------------------------------------------------


def test_resolve_needs_evidence_then_writes_an_override_by_the_logged_in_user(
    site: Site,
) -> None:
    op_id = stage(site.engine, status="unknown", reason="lease_expired")
    c = site.client()
    status, headers, _ = c.act("t1", op_id, action="resolve", outcome="applied",
                               reason="seen in the provider dashboard", evidence="")
    assert status == 303
    assert row(site.engine, "t1", op_id)["status"] == "unknown"
    _, _, page = c.get(headers["location"])
    assert "evidence reference is required" in page
    c.act("t1", op_id, action="resolve", outcome="applied",
          reason="seen in the provider dashboard", evidence="https://dash.example/t/8472")
    assert row(site.engine, "t1", op_id)["status"] == "applied"
    (event,) = overrides_of(site.engine, "t1", op_id)
    assert (event["kind"], event["actor"], event["from_status"], event["to_status"]) == (
        "override", "alice", "unknown", "applied")
    assert event["evidence_ref"] == "https://dash.example/t/8472"
    assert event["reason"] == "seen in the provider dashboard"


def test_requeue_cancel_approve_revoke_and_reveal_are_audited(site: Site) -> None:
    c = site.client()
    unknown = stage(site.engine, status="unknown", reason="lease_expired")
    c.act("t1", unknown, action="requeue", reason="not in the ledger", evidence="case-1")
    assert row(site.engine, "t1", unknown)["status"] == "pending"
    pending = stage(site.engine)
    c.act("t1", pending, action="cancel", reason="customer withdrew")
    assert row(site.engine, "t1", pending)["status"] == "cancelled"
    gated = stage(site.engine, status="blocked", reason="approval_missing",
                  requires_approval=True)
    c.act("t1", gated, action="approve", reason="checked the amount", release="1")
    assert row(site.engine, "t1", gated)["status"] == "pending"
    c.act("t1", gated, action="revoke", reason="changed my mind")
    status, _, page = c.act("t1", gated, action="reveal", reason="support case 9")
    assert status == 200 and "&lt;script&gt;" in page and "<script>" not in page
    seen = [(e["kind"], e["actor"], e["reason"], e["evidence_ref"])
            for op in (unknown, pending, gated) for e in overrides_of(site.engine, "t1", op)]
    assert seen == [
        ("override", "alice", "not in the ledger", "case-1"),
        ("override", "alice", "customer withdrew", None),
        ("approval", "alice", "checked the amount", None),
        ("revocation", "alice", "changed my mind", None),
        ("payload_revealed", "alice", "support case 9", None),
    ]
    requeued = events(site.engine, "t1", gated)[-3]
    assert (requeued["kind"], requeued["actor"], requeued["to_status"]) == (
        "transition", "alice", "pending")


def test_a_refused_action_is_reported_and_writes_nothing(site: Site) -> None:
    op_id = stage(site.engine, status="unknown", reason="lease_expired")
    c = site.client()
    _, headers, _ = c.act("t1", op_id, action="cancel", reason="stop it")
    _, _, page = c.get(headers["location"])
    assert "cancel refused" in page and "cannot be recalled" in page
    assert row(site.engine, "t1", op_id)["status"] == "unknown"
    assert overrides_of(site.engine, "t1", op_id) == []
