"""Cancellation, deadlines and task budgets, enforced on the database clock and from
persisted records, with real ``outboxd`` processes (killed where a crash is the point)."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest
import sqlalchemy as sa

from dispatcher.engine.authority import Authority
from dispatcher.store import store_for
from outbox.api import cancel_task
from outbox.records import OperationRecord
from tests.authority import (
    TENANT,
    config,
    db_now,
    detail_of,
    effects_of,
    events_of,
    operation,
    reason_of,
    stage_task,
)
from tests.dispatcher import engine_for
from tests.support.daemon import DaemonProcess, run_once, wait_until
from tests.support.sim import SimProcess


def _sql(engine: sa.Engine, text: str, **params: object) -> None:
    with engine.begin() as conn:
        conn.execute(sa.text(text), params)


@pytest.mark.slow
def test_cancellation_before_and_after_possible_dispatch(sqlite_url: str, tmp_path: Path) -> None:
    engine = engine_for(sqlite_url)
    try:
        stage_task(engine, "quiet", {"never": {}})
        stage_task(engine, "waits", {"needs-ok": {"requires_approval": True}})
        stage_task(engine, "slow", {"in-flight": {}})
        with engine.begin() as conn:  # cancelled while pending: never sent
            assert cancel_task(conn, tenant_id=TENANT, task_id="quiet", actor="alice").cancelled \
                == ("never",)
        with SimProcess(tmp_path, "--p-slow", "1", "--slow-seconds", "3") as sim:
            cfg = config(tmp_path, sqlite_url, sim, in_flight_seconds=5,
                         dispatcher={"lease_seconds": 1.5})
            with DaemonProcess(cfg) as d:
                wait_until(lambda: reason_of(engine, "in-flight")[0] == "dispatching"
                           and reason_of(engine, "needs-ok")[0] == "blocked"
                           and sim.stats()["requests"] == 1, timeout=20,
                           message="the request is at the (slow) receiver")
                d.kill()  # crash while the request is at the receiver
            with engine.begin() as conn:
                late = cancel_task(conn, tenant_id=TENANT, task_id="slow", actor="alice",
                                   reason="customer cancelled")
                blocked = cancel_task(conn, tenant_id=TENANT, task_id="waits", actor="alice")
            assert late.cancelled == () and late.too_late == ("in-flight",)
            assert blocked.cancelled == ("needs-ok",)
            [event] = [e for e in events_of(engine, "in-flight") if e["kind"] == "cancel_too_late"]
            assert (event["actor"], event["from_status"]) == ("alice", "dispatching")
            with DaemonProcess(cfg):  # recovery: unknown, then reconciled from the receiver
                wait_until(lambda: reason_of(engine, "in-flight")[0] == "applied", timeout=60)
            path = [(e["kind"], e["to_status"]) for e in events_of(engine, "in-flight")]
            assert path[-1] == ("reconciliation", "applied")
            assert ("transition", "unknown") in path  # the lease expired while dispatching
            assert effects_of(sim, "in-flight") == 1 and sim.stats()["duplicates"] == 0
            assert reason_of(engine, "never") == ("cancelled", "task_cancelled")
            assert reason_of(engine, "needs-ok") == ("cancelled", "task_cancelled")
            assert effects_of(sim, "never") == 0 and effects_of(sim, "needs-ok") == 0
    finally:
        engine.dispose()


@pytest.mark.slow
def test_deadlines_and_task_budget_in_one_batch(db_url: str, tmp_path: Path) -> None:
    """Operation and task deadlines on the database clock: a passed deadline is never sent.
    A task's ``max_attempts`` counts every attempt of its operations, within a batch too."""
    engine = engine_for(db_url)
    try:
        soon = db_now(engine) + timedelta(seconds=0.5)
        stage_task(engine, "deadlines", {"op-deadline": {"deadline_at": soon}, "in-time": {
            "deadline_at": soon + timedelta(hours=1)}})
        stage_task(engine, "task-deadline", {"task-late": {}})
        _sql(engine, "UPDATE outbox_tasks SET deadline_at = :d WHERE task_id = 'task-deadline'",
             d=soon)
        stage_task(engine, "budget", {f"b{i}": {} for i in range(3)})
        _sql(engine, "UPDATE outbox_tasks SET max_attempts = 2 WHERE task_id = 'budget'")
        wait_until(lambda: db_now(engine) > soon, timeout=10)
        with SimProcess(tmp_path) as sim:
            result = run_once(config(tmp_path, db_url, sim))
            assert result.returncode == 0, result.stderr[-2000:]
            assert reason_of(engine, "op-deadline") == ("blocked", "deadline_passed")
            assert reason_of(engine, "task-late") == ("blocked", "deadline_passed")
            assert reason_of(engine, "in-time") == ("applied", None)
            budget = {op: reason_of(engine, op) for op in ("b0", "b1", "b2")}
            assert sorted(budget.values(), key=str) == [
                ("applied", None), ("applied", None), ("blocked", "budget_exhausted")]
            for op in ("op-deadline", "task-late"):
                assert effects_of(sim, op) == 0 and operation(engine, op)["attempts"] == 0
            assert sim.stats()["requests"] == 3
    finally:
        engine.dispose()


@pytest.mark.slow
def test_task_budget_survives_a_restart(sqlite_url: str, tmp_path: Path) -> None:
    engine = engine_for(sqlite_url)
    try:
        stage_task(engine, "budget", {"flaky": {}})
        _sql(engine, "UPDATE outbox_tasks SET max_attempts = 3 WHERE task_id = 'budget'")
        with SimProcess(tmp_path, "--p-503", "1", "--retry-after", "0.05") as sim:
            cfg = config(tmp_path, sqlite_url, sim)
            with DaemonProcess(cfg) as d:
                wait_until(lambda: reason_of(engine, "flaky")[0] == "blocked", timeout=30)
                d.kill()
            assert reason_of(engine, "flaky") == ("blocked", "budget_exhausted")
            event = [e for e in events_of(engine, "flaky") if e["to_status"] == "blocked"][-1]
            assert detail_of(event) == {"scope": "task", "attempts": 3, "max_attempts": 3}
            assert sim.stats()["requests"] == 3
            # a person requeues it; a fresh process still counts the persisted attempts
            _sql(engine, "UPDATE outbox_operations SET status = 'pending', status_reason = NULL,"
                         " state_revision = state_revision + 1 WHERE operation_id = 'flaky'")
            with DaemonProcess(cfg):
                wait_until(lambda: reason_of(engine, "flaky")[0] == "blocked", timeout=20)
            assert reason_of(engine, "flaky") == ("blocked", "budget_exhausted")
            assert sim.stats()["requests"] == 3 and operation(engine, "flaky")["attempts"] == 3
    finally:
        engine.dispose()


def test_only_approvals_and_task_budgets_make_the_dispatching_step_lock(db_url: str) -> None:
    """Checking a batch takes locks that must hold until its mark commits only for an
    approval to consume or a task budget to count; any other batch is checked and marked
    statement by statement (on PostgreSQL, without BEGIN and COMMIT round trips)."""
    engine = engine_for(db_url)
    try:
        stage_task(engine, "plain", {"p1": {}, "p2": {}})
        stage_task(engine, "budget", {"b1": {}})
        _sql(engine, "UPDATE outbox_tasks SET max_attempts = 3 WHERE task_id = 'budget'")
        stage_task(engine, "approval", {"a1": {"requires_approval": True}})
        with engine.begin() as conn:
            _, claimed, task_rows = store_for(engine.dialect.name).claim(
                conn, worker="w", limit=10, lease_seconds=30)
        by_task: dict[str, list[OperationRecord]] = {}
        for op in claimed:
            by_task.setdefault(op.task_id, []).append(op)
        authority = Authority()
        now = db_now(engine)
        assert not authority.needs_lock(by_task["plain"], task_rows)
        with engine.connect() as conn:
            assert authority.check(conn, by_task["plain"], now) == {}
        assert authority.needs_lock(by_task["budget"], task_rows)
        assert authority.needs_lock(by_task["approval"], task_rows)
        assert authority.needs_lock(by_task["plain"] + by_task["budget"], task_rows)
    finally:
        engine.dispose()
