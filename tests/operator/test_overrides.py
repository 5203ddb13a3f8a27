"""Overrides on both dialects: evidence rules, the audit record, requeue with the same key,
and what cannot be recalled. States come from the dispatcher's own statements."""

from __future__ import annotations

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Engine

from dispatcher.engine.outcomes import MAYBE_APPLIED
from outbox import overrides, recovery
from outbox.api import get_operation
from outbox.errors import IllegalTransition, OperationNotFound
from tests.operator import TENANT, make_blocked, make_dispatching, make_unknown, stage


def _op(engine: Engine, operation_id: str) -> dict[str, object]:
    with engine.connect() as conn:
        row = conn.execute(
            sa.text("SELECT * FROM outbox_operations WHERE operation_id = :o"), {"o": operation_id}
        ).mappings().one()
    return dict(row)


def _overrides(engine: Engine) -> list[dict[str, object]]:
    with engine.connect() as conn:
        return [dict(r) for r in conn.execute(sa.text(
            "SELECT * FROM outbox_events WHERE kind = 'override' ORDER BY id")).mappings()]


def test_maybe_applied_mirrors_the_dispatcher() -> None:
    assert recovery.MAYBE_APPLIED == MAYBE_APPLIED


def test_unknown_resolution_needs_evidence_and_is_recorded(engine: Engine) -> None:
    stage(engine, "task-u", ["op-a", "op-n"])
    make_unknown(engine)
    assert _op(engine, "op-a")["status"] == "unknown"
    key_before = _op(engine, "op-n")["idempotency_key"]

    with engine.begin() as conn:  # applied without evidence: refused, nothing written
        with pytest.raises(overrides.EvidenceRequired):
            overrides.resolve(conn, tenant_id=TENANT, operation_id="op-a", outcome="applied",
                              actor="alice", reason="saw it", evidence="")
        with pytest.raises(overrides.EvidenceRequired):
            overrides.requeue(conn, tenant_id=TENANT, operation_id="op-n", actor="alice",
                              reason="retry it")
    assert _op(engine, "op-a")["status"] == "unknown" and _overrides(engine) == []

    with engine.begin() as conn:
        done = overrides.resolve(conn, tenant_id=TENANT, operation_id="op-a", outcome="applied",
                                 actor="alice", reason="found in the CRM",
                                 evidence="crm://tickets/8472")
        overrides.resolve(conn, tenant_id=TENANT, operation_id="op-n", outcome="not_applied",
                          actor="bob", reason="not in the provider's ledger",
                          evidence="support-case-17")
    assert (done.from_status, done.to_status) == ("unknown", "applied")
    a, n = _op(engine, "op-a"), _op(engine, "op-n")
    assert a["status"] == "applied" and a["status_reason"] == "operator_resolved_applied"
    assert n["status"] == "pending" and n["last_outcome"] == "reconciled_not_applied"
    assert n["idempotency_key"] == key_before  # the same key: never a new one
    events = _overrides(engine)
    assert [(e["operation_id"], e["from_status"], e["to_status"], e["actor"], e["evidence_ref"])
            for e in events] == [
        ("op-a", "unknown", "applied", "alice", "crm://tickets/8472"),
        ("op-n", "unknown", "pending", "bob", "support-case-17"),
    ]
    assert events[0]["reason"] == "found in the CRM" and events[0]["id"] == done.event_id

    with engine.begin() as conn:  # terminal now: a second resolution is refused
        with pytest.raises(overrides.OverrideRefused):
            overrides.resolve(conn, tenant_id=TENANT, operation_id="op-a", outcome="rejected",
                              actor="alice", reason="x", evidence="y")


def test_blocked_requeue_and_cancel_rules(engine: Engine) -> None:
    stage(engine, "task-b", ["op-b", "op-c"])
    make_blocked(engine)
    assert _op(engine, "op-b")["status"] == "blocked"
    assert _op(engine, "op-b")["status_reason"] == "needs_operator"
    stage(engine, "task-d", ["op-d"])
    make_dispatching(engine)
    stage(engine, "task-p", ["op-p"])

    with engine.begin() as conn:
        overrides.requeue(conn, tenant_id=TENANT, operation_id="op-b", actor="carol",
                          reason="provider fixed")
        overrides.cancel(conn, tenant_id=TENANT, operation_id="op-c", actor="carol",
                         reason="not wanted")
        overrides.cancel(conn, tenant_id=TENANT, operation_id="op-p", actor="carol",
                         reason="not wanted")
        with pytest.raises(overrides.CannotRecall, match="cannot be recalled"):
            overrides.cancel(conn, tenant_id=TENANT, operation_id="op-d", actor="carol",
                             reason="too late")
        with pytest.raises(OperationNotFound):
            overrides.cancel(conn, tenant_id=TENANT, operation_id="nope", actor="c", reason="r")
    b = _op(engine, "op-b")
    # Requeued without evidence: the possibly-applied outcome stays, so the dispatcher still
    # re-sends only with the same key inside the receiver's dedup window.
    assert b["status"] == "pending" and b["last_outcome"] in MAYBE_APPLIED
    assert _op(engine, "op-c")["status"] == "cancelled"
    assert _op(engine, "op-p")["status"] == "cancelled"
    assert _op(engine, "op-d")["status"] == "dispatching"
    assert [(e["operation_id"], e["to_status"]) for e in _overrides(engine)] == [
        ("op-b", "pending"), ("op-c", "cancelled"), ("op-p", "cancelled")]


def test_unknown_cannot_be_cancelled_and_stale_overrides_write_nothing(engine: Engine) -> None:
    stage(engine, "task-s", ["op-s"])
    make_unknown(engine)
    with engine.begin() as conn:
        with pytest.raises(overrides.CannotRecall):
            overrides.cancel(conn, tenant_id=TENANT, operation_id="op-s", actor="d", reason="r")
        stale = get_operation(conn, tenant_id=TENANT, operation_id="op-s")
        overrides.requeue(conn, tenant_id=TENANT, operation_id="op-s", actor="d", reason="r",
                          evidence="ledger-export-3")
    with engine.begin() as conn, pytest.raises(overrides.ConcurrentChange):
        overrides._apply(conn, stale, overrides.S.REJECTED, actor="d", reason="r",
                         evidence="e", status_reason="x", values={}, detail={})
    with engine.begin() as conn, pytest.raises(IllegalTransition):
        fresh = get_operation(conn, tenant_id=TENANT, operation_id="op-s")
        overrides._apply(conn, fresh, overrides.S.APPLIED, actor="d", reason="r",
                         evidence="e", status_reason="x", values={}, detail={})
    assert _op(engine, "op-s")["last_outcome"] == "reconciled_not_applied"
    assert len(_overrides(engine)) == 1


@pytest.mark.parametrize("field", ["actor", "reason", "evidence"])
def test_a_nul_character_in_an_override_is_refused_by_name(engine: Engine, field: str) -> None:
    """A NUL character (a web form's ``%00``, a pasted binary) in what a person writes is
    refused with the field's name, on both dialects — PostgreSQL's ``text`` holds no
    U+0000, and the override would otherwise fail there with a driver error."""
    stage(engine, "task-n", ["op-n"])
    make_unknown(engine)
    given = {"actor": "alice", "reason": "seen in the CRM", "evidence": "TICKET-1"}
    given[field] = "a\x00b"
    with engine.begin() as conn, pytest.raises(overrides.OverrideRefused) as refused:
        overrides.resolve(conn, tenant_id=TENANT, operation_id="op-n", outcome="applied",
                          **given)
    assert str(refused.value) == f"{field} holds a NUL character: remove it (field={field!r})"
    assert _op(engine, "op-n")["status"] == "unknown"
