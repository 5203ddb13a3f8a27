"""``outbox.approvals`` and ``outboxd approve|revoke`` against real databases (no daemon):
what is stored, what is refused, what is logged, and the matching rule itself."""

from __future__ import annotations

import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Engine

import outbox
from outbox import approvals, errors
from outbox.digest import payload_digest
from tests.authority import TENANT, approve, db_now, detail_of, events_of, stage_task
from tests.support.daemon import REPO_ROOT, write_config


def test_approve_binds_to_the_current_payload_digest(engine: Engine) -> None:
    payload = {"refund": {"amount": 75, "currency": "GBP"}, "case": "8472"}
    stage_task(engine, "case-8472", {"refund": {"payload": payload, "requires_approval": True}})
    result = approve(engine, "refund", seconds=3600)
    a = result.approval
    assert a.payload_hash == payload_digest(payload)
    assert a.approved_by == "alice" and a.reason == "looks right"
    assert a.expires_at is not None and a.expires_at > db_now(engine)
    assert a.consumed_at is None and a.revoked_at is None and not result.released
    [event] = [e for e in events_of(engine, "refund") if e["kind"] == "approval"]
    assert event["actor"] == "alice" and event["reason"] == "looks right"
    assert detail_of(event)["payload_hash"] == a.payload_hash
    assert outbox.approve is approvals.approve and outbox.revoke is approvals.revoke


def test_approve_refuses_what_it_cannot_authorise(engine: Engine) -> None:
    stage_task(engine, "t", {"needs": {"requires_approval": True}, "free": {}})
    with engine.begin() as conn:
        with pytest.raises(errors.OperationNotFound):
            approvals.approve(conn, tenant_id=TENANT, operation_id="nope", actor="a")
        with pytest.raises(errors.ApprovalError, match="does not require approval"):
            approvals.approve(conn, tenant_id=TENANT, operation_id="free", actor="a")
        with pytest.raises(errors.ApprovalError, match="actor"):
            approvals.approve(conn, tenant_id=TENANT, operation_id="needs", actor=" ")
        with pytest.raises(errors.ApprovalError, match="not in the future"):
            approvals.approve(conn, tenant_id=TENANT, operation_id="needs", actor="a",
                              expires_at=datetime.now(UTC) - timedelta(minutes=1))
        with pytest.raises(errors.ApprovalError, match="positive"):
            approvals.approve(conn, tenant_id=TENANT, operation_id="needs", actor="a",
                              expires_in=timedelta(0))
        conn.execute(sa.text("UPDATE outbox_operations SET status = 'rejected' "
                             "WHERE operation_id = 'needs'"))
        with pytest.raises(errors.ApprovalError, match="finished"):
            approvals.approve(conn, tenant_id=TENANT, operation_id="needs", actor="a")
    assert [e for e in events_of(engine) if e["kind"] == "approval"] == []


def test_revoke_withdraws_every_live_approval_and_logs_it(engine: Engine) -> None:
    stage_task(engine, "t", {"op": {"requires_approval": True}})
    approve(engine, "op")
    approve(engine, "op", seconds=600)
    with engine.begin() as conn:
        with pytest.raises(errors.ApprovalError, match="reason"):
            approvals.revoke(conn, tenant_id=TENANT, operation_id="op", actor="bob", reason="")
        assert approvals.revoke(conn, tenant_id=TENANT, operation_id="op", actor="bob",
                                reason="customer withdrew") == 2
    with engine.begin() as conn:
        with pytest.raises(errors.ApprovalError, match="no unrevoked"):
            approvals.revoke(conn, tenant_id=TENANT, operation_id="op", actor="bob", reason="x")
        found = approvals.list_approvals(conn, tenant_id=TENANT, operation_id="op")
    assert {(a.revoked_by, a.revoked_at is not None) for a in found} == {("bob", True)}
    [event] = [e for e in events_of(engine, "op") if e["kind"] == "revocation"]
    assert (event["actor"], event["reason"]) == ("bob", "customer withdrew")
    assert detail_of(event)["too_late"] is False


def _approval(id_: int, digest: str, *, expires: datetime | None = None,
              revoked: bool = False) -> approvals.Approval:
    now = datetime.now(UTC)
    return approvals.Approval(id_, TENANT, "op", digest, "a", None, now, expires,
                              now if revoked else None, "b" if revoked else None, None, None)


def test_the_matching_rule() -> None:
    now = datetime.now(UTC)
    past, future = now - timedelta(seconds=1), now + timedelta(hours=1)
    d, other = "sha256:aa", "sha256:bb"
    assert approvals.evaluate([], d, now) == (None, approvals.APPROVAL_MISSING)
    assert approvals.evaluate([_approval(1, other)], d, now)[1] == approvals.APPROVAL_MISMATCH
    assert approvals.evaluate([_approval(1, d, expires=past)], d, now)[1] == "approval_expired"
    assert approvals.evaluate([_approval(1, d, revoked=True)], d, now)[1] == "approval_revoked"
    assert approvals.evaluate([_approval(1, d, revoked=True), _approval(2, d, expires=past)],
                              d, now)[1] == "approval_expired"  # the newest decides
    ok = _approval(3, d, expires=future)
    assert approvals.evaluate([_approval(1, other), ok, _approval(2, d, revoked=True)], d,
                              now) == (ok, None)
    assert approvals.evaluate([ok], None, now)[1] == approvals.APPROVAL_MISMATCH


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "dispatcher.cli", *args], cwd=REPO_ROOT,
                          capture_output=True, text=True, timeout=60, check=False)


def test_cli_approve_revoke_and_tenant_default(sqlite_url: str, tmp_path: Path) -> None:
    from outbox import db

    engine = db.create_engine(sqlite_url)
    try:
        stage_task(engine, "t", {"op": {"requires_approval": True}})
        cfg = str(write_config(tmp_path, sqlite_url, {}))
        bad = _cli("approve", "op", "--actor", "alice", "--expires", "soon", "--config", cfg)
        assert bad.returncode == 2 and "invalid duration" in bad.stderr
        ok = _cli("approve", "op", "--actor", "alice", "--expires", "2h", "--reason", "fine",
                  "--config", cfg)
        assert ok.returncode == 0, ok.stderr
        assert "approved op (tenant t1)" in ok.stdout
        # it was pending: the output says the approval is used at its next send
        assert ok.stdout.splitlines()[-1] == (
            "the operation is pending; the approval is used at its next send")
        with engine.connect() as conn:
            [a] = approvals.list_approvals(conn, tenant_id=TENANT, operation_id="op")
        assert a.expires_at is not None
        assert timedelta(minutes=119) < a.expires_at - a.approved_at <= timedelta(minutes=121)
        missing = _cli("approve", "ghost", "--actor", "alice", "--config", cfg)
        assert missing.returncode == 1 and "No such operation" in missing.stderr
        stage_task(engine, "t2", {"op": {"requires_approval": True}}, tenant="t2")
        ambiguous = _cli("revoke", "op", "--actor", "bob", "--reason", "r", "--config", cfg)
        assert ambiguous.returncode == 2 and "--tenant" in ambiguous.stderr
        revoked = _cli("revoke", "op", "--actor", "bob", "--reason", "r", "--tenant", "t1",
                       "--config", cfg)
        assert revoked.returncode == 0, revoked.stderr
        assert "revoked 1 approval(s)" in revoked.stdout
    finally:
        engine.dispose()


def test_cli_approve_releases_what_waits_only_for_it(sqlite_url: str, tmp_path: Path) -> None:
    """``outboxd approve`` on an operation blocked ``approval_missing`` releases it to
    ``pending`` and says so; ``--no-release`` records the approval and says what to run."""
    from outbox import db

    engine = db.create_engine(sqlite_url)
    try:
        stage_task(engine, "t", {"a": {"requires_approval": True},
                                 "b": {"requires_approval": True}})
        with engine.begin() as conn:
            conn.exec_driver_sql("UPDATE outbox_operations SET status = 'blocked', "
                                 "status_reason = 'approval_missing'")
        cfg = str(write_config(tmp_path, sqlite_url, {}))
        released = _cli("approve", "a", "--actor", "alice", "--config", cfg)
        kept = _cli("approve", "b", "--actor", "alice", "--no-release", "--config", cfg)
        assert released.returncode == 0 and kept.returncode == 0, (released, kept)
        assert released.stdout.splitlines()[-1] == (
            "released: blocked -> pending; it will be dispatched")
        assert kept.stdout.splitlines()[-1] == (
            "recorded only: the operation stays blocked (approval_missing); release it with "
            "`outboxd ops requeue`")
        with engine.connect() as conn:
            status = dict(conn.exec_driver_sql(
                "SELECT operation_id, status FROM outbox_operations").all())
        assert status == {"a": "pending", "b": "blocked"}
    finally:
        engine.dispose()
