"""Migration 0002 upgrades a live 0001 database: rows in every operation state, inserted
with plain SQL at 0001, are upgraded to head and then dispatched by a real ``outboxd run
--once`` against the sim: pending ones applied, expired leases recovered by the rules
(claimed -> pending -> applied; dispatching -> unknown, never straight to pending),
terminal ones untouched. On both dialects."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Engine

from outbox import db, migrate
from tests.dispatcher import PROVIDER, effects, key_of, rows, transitions
from tests.migration import database_at
from tests.support.daemon import http_provider, run_once, write_config
from tests.support.sim import SimProcess

TERMINAL = ("applied", "verified", "rejected", "cancelled")
PAST = "2020-01-01 00:00:00"
ROWS: dict[str, tuple[str, dict[str, object]]] = {  # operation_id: (status, extras)
    "pending-1": ("pending", {}),
    "pending-2": ("pending", {}),
    "claimed": ("claimed", {"fencing_token": 1, "lease_owner": "gone:1",
                            "lease_expires_at": PAST}),
    "dispatching": ("dispatching", {"fencing_token": 1, "lease_owner": "gone:1",
                                    "lease_expires_at": PAST, "attempts": 1,
                                    "first_dispatched_at": PAST,
                                    "last_attempt_started_at": PAST}),
    "applied": ("applied", {"receipt": '{"id": "r-1"}', "attempts": 1}),
    "verified": ("verified", {"receipt": '{"id": "r-2"}', "attempts": 1}),
    "rejected": ("rejected", {"status_reason": "http_422", "attempts": 1}),
    "unknown": ("unknown", {"attempts": 1, "first_dispatched_at": PAST,
                            "last_attempt_started_at": PAST}),
    "blocked": ("blocked", {"status_reason": "approval_missing"}),
    "cancelled": ("cancelled", {"status_reason": "task_cancelled"}),
}


def operations(engine: Engine) -> dict[str, dict[str, object]]:
    """Every row as stored (raw SQL: the 0001 table has no 0002 columns yet)."""
    return {str(r["operation_id"]): r for r in rows(engine, "SELECT * FROM outbox_operations")}


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def at_0001(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    yield from database_at(request, tmp_path, "0001", _insert_every_state)


def _insert_every_state(engine: Engine) -> None:
    with engine.begin() as conn:
        for op_id, (status, extra) in ROWS.items():
            cols = {"tenant_id": "t1", "task_id": f"task-{op_id}", "operation_id": op_id,
                    "provider": PROVIDER, "payload": f'{{"op": "{op_id}"}}', "status": status,
                    **extra}
            names = ", ".join(cols)
            values = ", ".join(f":{c}" for c in cols)
            conn.execute(sa.text(f"INSERT INTO outbox_operations ({names}) VALUES ({values})"),
                         cols)


@pytest.mark.slow
def test_0001_rows_in_every_state_survive_0002_and_dispatch(at_0001: str, tmp_path: Path) -> None:
    engine = db.create_engine(at_0001)
    try:
        before = operations(engine)
        assert {r["status"] for r in before.values()} == {s for s, _ in ROWS.values()}
        assert migrate.upgrade(engine) == migrate.head()
        migrate.check_current(engine)
        upgraded = operations(engine)
        for op_id, row in upgraded.items():  # the upgrade itself changed no row
            assert row["payload_purged_at"] is None and row["receipt_purged_at"] is None
            assert {k: v for k, v in row.items() if not k.endswith("_purged_at")} == before[op_id]

        dispatch_every_state(engine, at_0001, tmp_path, upgraded)
    finally:
        engine.dispose()


def dispatch_every_state(
    engine: Engine, url: str, tmp_path: Path, upgraded: dict[str, dict[str, object]]
) -> dict[str, dict[str, object]]:
    """Run ``outboxd run --once`` against the sim on the upgraded database holding
    :data:`ROWS` (``upgraded``: as they were after the upgrade) and check each was dispatched
    by the rules: pending ones applied once, the expired claim returned to pending and then
    applied, the expired dispatch made unknown (never pending) and reconciled with at most
    one effect, rows at rest untouched. Returns the rows after."""
    with SimProcess(tmp_path) as sim:
        result = run_once(write_config(tmp_path, url, {PROVIDER: http_provider(sim)}))
        assert result.returncode == 0, result.stderr[-3000:]
        sent = effects(sim)
    after = operations(engine)
    for op_id in ("pending-1", "pending-2", "claimed"):
        assert after[op_id]["status"] == "applied", op_id
        assert sent.get(key_of(op_id)) == 1, op_id
    assert transitions(engine, "claimed")[0] == ("claimed", "pending")
    assert transitions(engine, "dispatching")[0] == ("dispatching", "unknown")
    for op_id in ("dispatching", "unknown"):  # reconciled by the rules, at most one effect
        assert after[op_id]["status"] in ("unknown", "applied", "pending", "blocked"), op_id
        # blocked only with a reason (e.g. budget_exhausted: first sent in 2020)
        assert after[op_id]["status"] != "blocked" or after[op_id]["status_reason"]
        assert sent.get(key_of(op_id), 0) <= 1, op_id
    for op_id in (*TERMINAL, "blocked"):  # untouched
        assert after[op_id] == upgraded[op_id], op_id
        assert key_of(op_id) not in sent, op_id
    return after
