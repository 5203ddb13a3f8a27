"""Cancelling a task never turns a possibly-applied effect into "cancelled": a pending row
whose earlier attempt ended ambiguously cannot be recalled, so it goes to ``unknown`` and
is reconciled (found -> applied; not found -> cancelled by a later sweep)."""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.engine import Engine

import outbox
from outbox.api import sweep_cancelled


def test_cancel_reconciles_a_possibly_applied_pending_row(engine: Engine) -> None:
    with engine.begin() as conn:
        for op in ("fresh", "retrying"):
            outbox.enqueue(conn, tenant_id="t", task_id="k", operation_id=op,
                           provider="p", payload={"op": op})
        conn.execute(sa.text("UPDATE outbox_operations SET last_outcome = 'ambiguous', "
                             "attempts = 1 WHERE operation_id = 'retrying'"))
    with engine.begin() as conn:
        result = outbox.cancel_task(conn, tenant_id="t", task_id="k", actor="ops",
                                    reason="customer withdrew")
    assert result.cancelled == ("fresh",)
    assert result.too_late == ("retrying",)
    with engine.connect() as conn:
        rows = dict(conn.execute(sa.text(
            "SELECT operation_id, status || '/' || status_reason FROM outbox_operations")).all())
        kinds = conn.execute(sa.text(
            "SELECT kind FROM outbox_events WHERE operation_id = 'retrying'")).scalars().all()
    assert rows == {"fresh": "cancelled/task_cancelled", "retrying": "unknown/cancel_too_late"}
    assert kinds == ["cancel_too_late"]
    # reconciliation found nothing: the row is requeued as not applied, then cancelled
    with engine.begin() as conn:
        conn.execute(sa.text("UPDATE outbox_operations SET status = 'pending', "
                             "last_outcome = 'reconciled_not_applied' "
                             "WHERE operation_id = 'retrying'"))
        again = sweep_cancelled(conn)
    assert again.cancelled == ("retrying",)
