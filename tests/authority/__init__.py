"""Tests of authority and limits: approvals, cancellation, deadlines, budgets, versions,
artifacts and policy. Real databases (both dialects where cheap), real ``outboxd``
processes and the real ``outboxd sim`` receiver; no mocks. Helpers shared by the modules."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from outbox import approvals
from outbox.api import StagedOperation, advance
from tests.dispatcher import PROVIDER, TENANT, events_of, key_of, operation, rows
from tests.support.daemon import http_provider, write_config

__all__ = ["PROVIDER", "TENANT", "events_of", "key_of", "operation", "rows"]


def stage_task(
    engine: Engine,
    task: str,
    ops: dict[str, dict[str, Any]],
    *,
    workflow_version: str | None = None,
    tenant: str = TENANT,
) -> None:
    """Create ``task`` with one operation per entry (``{op_id: StagedOperation fields}``;
    the payload defaults to a small object naming the operation)."""
    staged = []
    for op_id, fields in ops.items():
        values = {"provider": PROVIDER, **fields}
        if "payload" not in values and "payload_ref" not in values:
            values["payload"] = {"op": op_id, "amount": 75}
        staged.append(StagedOperation(operation_id=op_id, **values))
    with engine.begin() as conn:
        advance(conn, task, tenant_id=tenant, expected_revision=0, phase="staged",
                operations=staged, workflow_version=workflow_version)


def approve(engine: Engine, op_id: str, *, seconds: float | None = None,
            actor: str = "alice") -> approvals.ApprovalResult:
    with engine.begin() as conn:
        return approvals.approve(
            conn, tenant_id=TENANT, operation_id=op_id, actor=actor,
            expires_in=timedelta(seconds=seconds) if seconds is not None else None,
            reason="looks right")


def db_now(engine: Engine) -> Any:
    from outbox.types import db_now as now

    with engine.connect() as conn:
        return conn.execute(sa.select(now())).scalar_one()


def reason_of(engine: Engine, op_id: str) -> tuple[str, str | None]:
    row = operation(engine, op_id)
    return str(row["status"]), row["status_reason"]


def config(tmp_path: Path, db_url: str, sim: Any, *, artifacts: Path | None = None,
           dispatcher: dict[str, Any] | None = None, **provider: Any) -> Path:
    path = write_config(tmp_path, db_url, {PROVIDER: http_provider(sim, **provider)},
                        dispatcher=dispatcher)
    if artifacts is not None:
        path.write_text(path.read_text() + f'\n[artifacts]\nroot = "{artifacts}"\n')
    return path


def effects_of(sim: Any, op_id: str) -> int:
    return int(sim.stats()["effects_per_key"].get(key_of(op_id), 0))


def detail_of(event: dict[str, Any]) -> dict[str, Any]:
    """An event's JSON detail (SQLite returns it as text through a raw query)."""
    value = event["detail"]
    if isinstance(value, str):
        value = json.loads(value)
    return dict(value or {})


def blocked_event(engine: Engine, op_id: str) -> dict[str, Any]:
    found = [e for e in events_of(engine, op_id) if e["to_status"] == "blocked"]
    assert found, f"no blocked event for {op_id}"
    return found[-1]
