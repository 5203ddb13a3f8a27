"""Approvals as the dispatcher enforces them, against the real sim: zero sends without a
valid matching approval (missing, expired, revoked, forged with a wrong hash), consumption
once, retries under one approval, and a re-check after a long wait."""

from __future__ import annotations

from pathlib import Path

import pytest
import sqlalchemy as sa

from outbox import approvals, schema
from tests.authority import (
    TENANT,
    approve,
    config,
    db_now,
    detail_of,
    effects_of,
    events_of,
    operation,
    reason_of,
    rows,
    stage_task,
)
from tests.dispatcher import engine_for
from tests.support.daemon import DaemonProcess, run_once, wait_until
from tests.support.sim import SimProcess

FORGED_HASH = "sha256:" + "0" * 64


def _forge(engine: sa.Engine, op_id: str) -> None:
    with engine.begin() as conn:
        conn.execute(sa.text(
            "INSERT INTO outbox_approvals (tenant_id, operation_id, payload_hash, approved_by) "
            "VALUES (:t, :o, :h, 'mallory')"), {"t": TENANT, "o": op_id, "h": FORGED_HASH})


def _revoke(engine: sa.Engine, op_id: str) -> None:
    with engine.begin() as conn:
        approvals.revoke(conn, tenant_id=TENANT, operation_id=op_id, actor="bob",
                         reason="changed my mind")


def _approvals_of(engine: sa.Engine, op_id: str) -> list[approvals.Approval]:
    with engine.connect() as conn:
        return approvals.list_approvals(conn, tenant_id=TENANT, operation_id=op_id)


@pytest.mark.slow
def test_zero_sends_without_a_valid_matching_approval(db_url: str, tmp_path: Path) -> None:
    engine = engine_for(db_url)
    try:
        needs = {"requires_approval": True}
        names = ("ok", "missing", "expired", "revoked", "forged")
        stage_task(engine, "case-1", dict.fromkeys(names, needs) | {"free": {}})
        approve(engine, "ok", seconds=3600)
        expired = approve(engine, "expired", seconds=0.5).approval
        approve(engine, "revoked")
        _revoke(engine, "revoked")
        _forge(engine, "forged")
        assert expired.expires_at is not None
        wait_until(lambda: db_now(engine) > expired.expires_at, timeout=10)
        with SimProcess(tmp_path) as sim:
            cfg = config(tmp_path, db_url, sim)
            result = run_once(cfg)
            assert result.returncode == 0, result.stderr[-2000:]
            assert {op: reason_of(engine, op) for op in
                    ("ok", "free", "missing", "expired", "revoked", "forged")} == {
                "ok": ("applied", None), "free": ("applied", None),
                "missing": ("blocked", "approval_missing"),
                "expired": ("blocked", "approval_expired"),
                "revoked": ("blocked", "approval_revoked"),
                "forged": ("blocked", "approval_mismatch"),
            }
            for op in ("missing", "expired", "revoked", "forged"):
                assert effects_of(sim, op) == 0, op
                assert operation(engine, op)["attempts"] == 0
            assert sim.stats()["requests"] == 2

            [used] = _approvals_of(engine, "ok")
            assert used.consumed_at is not None
            assert used.consumed_fencing_token == operation(engine, "ok")["fencing_token"]
            consumed = [e for e in events_of(engine, "ok") if e["kind"] == "approval_consumed"]
            assert [detail_of(e)["approval_id"] for e in consumed] == [used.id]
            assert all(a.consumed_at is None for a in _approvals_of(engine, "forged"))

            # an approval recorded without release leaves it blocked; a plain one lets it go
            with engine.begin() as conn:
                kept = approvals.approve(conn, tenant_id=TENANT, operation_id="missing",
                                         actor="carol", release=False)
            assert not kept.released and reason_of(engine, "missing") == (
                "blocked", "approval_missing")
            assert "recorded only" in kept.next_step()
            res = approve(engine, "missing", seconds=600)
            assert res.released and "released" in res.next_step()
            result = run_once(cfg)
            assert result.returncode == 0, result.stderr[-2000:]
            assert reason_of(engine, "missing") == ("applied", None)
            assert effects_of(sim, "missing") == 1
            assert reason_of(engine, "forged") == ("blocked", "approval_mismatch")
    finally:
        engine.dispose()


@pytest.mark.slow
def test_release_checklist_idempotency_and_approvals(sqlite_url: str, tmp_path: Path) -> None:
    """Seed 001, release checklist: "Idempotency and approvals: keys survive retries;
    expired, revoked or mismatched approvals block dispatch." One approval covers the
    operation's retries (consumed once); a re-send after it expired needs a new one."""
    engine = engine_for(sqlite_url)
    try:
        needs = {"requires_approval": True}
        names = ("retry_ok", "retry_late", "revoked", "forged")
        stage_task(engine, "refund-8472", dict.fromkeys(names, needs))
        approve(engine, "retry_ok")  # no expiry
        late = approve(engine, "retry_late", seconds=3600).approval
        approve(engine, "revoked")
        _revoke(engine, "revoked")
        _forge(engine, "forged")
        key = operation(engine, "retry_ok")["idempotency_key"]
        with SimProcess(tmp_path, "--p-503", "1", "--retry-after", "5") as sim:
            cfg = config(tmp_path, sqlite_url, sim)
            with DaemonProcess(cfg) as d:
                wait_until(lambda: all(operation(engine, o)["attempts"] == 1 and
                                       operation(engine, o)["status"] == "pending"
                                       for o in ("retry_ok", "retry_late")), timeout=20,
                           message="first attempts refused with 503")
                # time passes while the retry waits (>= 5 s): its approval expires meanwhile
                now = db_now(engine)
                with engine.begin() as conn:
                    conn.execute(sa.update(schema.approvals)
                                 .where(schema.approvals.c.id == late.id)
                                 .values(expires_at=now))
                sim.control(p_503=0.0)
                wait_until(lambda: reason_of(engine, "retry_ok")[0] == "applied"
                           and reason_of(engine, "retry_late")[0] == "blocked", timeout=30,
                           message="retries decided")
                assert reason_of(engine, "retry_late") == ("blocked", "approval_expired")
                assert effects_of(sim, "retry_late") == 0

                # keys survive retries: two requests, one key, one effect
                ok = operation(engine, "retry_ok")
                assert ok["idempotency_key"] == key and ok["attempts"] == 2
                assert effects_of(sim, "retry_ok") == 1 and sim.stats()["duplicates"] == 0
                attempts = rows(engine, "SELECT * FROM outbox_attempts WHERE operation_id = "
                                        "'retry_ok' ORDER BY attempt")
                assert [a["result_class"] for a in attempts] == ["retryable", "applied"]
                [approval] = _approvals_of(engine, "retry_ok")  # consumed once, by attempt 1
                assert approval.consumed_fencing_token == attempts[0]["fencing_token"]
                assert attempts[1]["fencing_token"] > attempts[0]["fencing_token"]

                # a new approval covers the re-send (and releases the blocked operation)
                with engine.begin() as conn:
                    assert approvals.approve(conn, tenant_id=TENANT, operation_id="retry_late",
                                             actor="carol").released
                wait_until(lambda: reason_of(engine, "retry_late")[0] == "applied", timeout=20)
                old, new = _approvals_of(engine, "retry_late")
                assert old.consumed_at is not None and new.consumed_at is not None
                assert (new.consumed_fencing_token or 0) > (old.consumed_fencing_token or 0)
                assert effects_of(sim, "retry_late") == 1
            assert d.process is not None and d.process.returncode == 0
            for op, reason in (("revoked", "approval_revoked"), ("forged", "approval_mismatch")):
                assert reason_of(engine, op) == ("blocked", reason)
                assert effects_of(sim, op) == 0
            assert sim.stats()["duplicates"] == 0
    finally:
        engine.dispose()


@pytest.mark.slow
def test_revoked_before_a_blind_resend_is_reconciled_then_blocked(
    sqlite_url: str, tmp_path: Path
) -> None:
    """An ambiguous attempt may have landed: a revocation before its re-send does not hide
    that. The row goes to ``unknown``, is reconciled (not found), and only then blocks."""
    engine = engine_for(sqlite_url)
    try:
        stage_task(engine, "t", {"maybe": {"requires_approval": True}})
        approve(engine, "maybe")
        with SimProcess(tmp_path, "--p-5xx-before", "1") as sim:
            cfg = config(tmp_path, sqlite_url, sim)
            with DaemonProcess(cfg):
                wait_until(lambda: operation(engine, "maybe")["attempts"] >= 1, timeout=20)
                _revoke(engine, "maybe")
                wait_until(lambda: reason_of(engine, "maybe")[0] == "blocked", timeout=30)
            assert reason_of(engine, "maybe") == ("blocked", "approval_revoked")
            path = [(e["from_status"], e["to_status"], e["reason"])
                    for e in events_of(engine, "maybe") if e["kind"] == "transition"]
            assert ("claimed", "unknown", "approval_revoked") in path
            assert path[-1] == ("claimed", "blocked", "approval_revoked")
            assert effects_of(sim, "maybe") == 0
    finally:
        engine.dispose()
