"""The checker is not blind: synthetic records with a known answer, on a real SQLite file.

Approval check: an effect at the receiver for an approval-requiring operation is
authorised only if the ``dispatching`` event of the effect's fencing token follows an
``approval`` with no ``revocation`` in between (events in id order).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import sqlalchemy as sa

from outbox import approvals, db, schema
from outbox.api import StagedOperation, advance
from outbox.digest import default_idempotency_key
from tests.chaos.checker import _unauthorised_sends, failpoint_hits, failpoint_log

TENANT = "t-check"


def _dispatched(conn: Any, op_id: str, token: int) -> None:
    conn.execute(sa.insert(schema.events).values(
        tenant_id=TENANT, task_id="task", operation_id=op_id, kind="transition",
        from_status="claimed", to_status="dispatching", actor="w", fencing_token=token))


def _grant(conn: Any, op_id: str) -> None:
    approvals.approve(conn, tenant_id=TENANT, operation_id=op_id, actor="agent")


def _revoke(conn: Any, op_id: str) -> None:
    approvals.revoke(conn, tenant_id=TENANT, operation_id=op_id, actor="nemesis",
                     reason="test")


def test_sends_without_a_valid_approval_are_counted(sqlite_url: str) -> None:
    engine = db.create_engine(sqlite_url)
    names = ["ok", "after-revoke", "too-late", "no-dispatch", "reapproved", "plain"]
    with engine.begin() as conn:
        advance(conn, "task", tenant_id=TENANT, expected_revision=0, phase="staged",
                operations=[StagedOperation(operation_id=n, provider="p", payload={"n": n},
                                            requires_approval=n != "plain")
                            for n in names])
        _grant(conn, "ok")
        _dispatched(conn, "ok", 5)  # sent under a live approval
        _grant(conn, "after-revoke")
        _revoke(conn, "after-revoke")
        _dispatched(conn, "after-revoke", 7)  # sent after the revocation took effect
        _grant(conn, "too-late")
        _dispatched(conn, "too-late", 3)
        _revoke(conn, "too-late")  # revoked once the send had left: not a violation
        _grant(conn, "no-dispatch")  # an effect whose token never committed dispatching
        _grant(conn, "reapproved")
        _revoke(conn, "reapproved")
        _grant(conn, "reapproved")
        _dispatched(conn, "reapproved", 9)
        _dispatched(conn, "plain", 2)  # needs no approval
        ops = conn.execute(sa.text(
            "SELECT operation_id, idempotency_key, requires_approval FROM outbox_operations"
        )).all()
    key = {n: default_idempotency_key(TENANT, n) for n in names}
    effects = [{"key": key["ok"], "fencing_token": 5},
               {"key": key["after-revoke"], "fencing_token": 7},
               {"key": key["too-late"], "fencing_token": 3},
               {"key": key["no-dispatch"], "fencing_token": 4},
               {"key": key["reapproved"], "fencing_token": 9},
               {"key": key["plain"], "fencing_token": 2}]
    with engine.connect() as conn:
        bad = _unauthorised_sends(conn, list(ops), effects)
    engine.dispose()
    assert sorted(b.split(":")[0] for b in bad) == ["after-revoke", "no-dispatch"], bad


def test_failpoint_log_counts_each_point_and_action(tmp_path: Path) -> None:
    log = tmp_path / "fp.log"
    log.write_text("after_send kill 10\nafter_send stop 11\nin_reconcile stop 12\n"
                   "after_send stop 13\n\n")
    assert failpoint_log(log) == {("after_send", "kill"): 1, ("after_send", "stop"): 2,
                                  ("in_reconcile", "stop"): 1}
    assert failpoint_hits(log) == {"after_send": 3, "in_reconcile": 1}
