"""Retention by record type, legal holds and erasure, on both dialects, through the real
purge path (and, on PostgreSQL, as the retention role)."""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from dispatcher.config import RetentionConfig
from dispatcher.maintenance.cluster_lock import ClusterLock
from dispatcher.maintenance.retention import RetentionJob
from dispatcher.store import store_for
from dispatcher.store.retention import EraseCounts, ErasureRefused, PurgeCounts
from outbox import api, db, errors
from outbox.db import mapped_errors
from outbox.types import db_now
from tests.dispatcher import PROVIDER, rows
from tests.security import SecureDb, secure_db  # noqa: F401  (fixture)
from tests.support.daemon import http_provider, run_once, write_config
from tests.support.sim import SimProcess


def purge(engine: Engine, periods: Any, **kw: Any) -> PurgeCounts:
    """The store's purge in a transaction of its own, as the retention job runs it."""
    with engine.begin() as conn:
        return store_for(engine.dialect.name).purge(conn, periods, **kw)


def erase_tenant(engine: Engine, tenant_id: str, **kw: Any) -> EraseCounts:
    with engine.begin() as conn:
        return store_for(engine.dialect.name).erase_tenant(conn, tenant_id, **kw)


def retention_path(conn: Connection) -> Any:
    return store_for(conn.dialect.name).retention_path(conn)

CANARY = "canary-7f3e9c1d-retention"
PERIODS = RetentionConfig(payload_days=30, receipt_days=30, attempts_days=730,
                          events_days=730, approvals_days=730)
TABLES = ("outbox_operations", "outbox_attempts", "outbox_events", "outbox_approvals")


def _stage(engine: Engine, task: str, op_id: str, tenant: str = "t1") -> None:
    with engine.begin() as conn:
        api.advance(conn, task, tenant_id=tenant, expected_revision=0, state={"who": CANARY},
                    operations=[api.StagedOperation(op_id, PROVIDER, {"note": CANARY})])


def _records_of(engine: Engine, op_id: str) -> list[dict[str, Any]]:
    found = []
    for table in TABLES:
        found += rows(engine, f"SELECT * FROM {table} WHERE operation_id = :o", o=op_id)
    return found


def _json(value: Any) -> Any:
    """Raw SQL returns JSON as text on SQLite (a purged payload is the JSON value null)."""
    return json.loads(value) if isinstance(value, str) else value


def _op(engine: Engine, op_id: str) -> dict[str, Any]:
    row = rows(engine, "SELECT * FROM outbox_operations WHERE operation_id = :o", o=op_id)[0]
    return {k: _json(v) if k in ("payload", "receipt") else v for k, v in row.items()}


def _db_now(engine: Engine) -> datetime:
    with engine.connect() as conn:
        value = conn.execute(sa.select(db_now())).scalar_one()
    assert isinstance(value, datetime)
    return value


@pytest.mark.slow
def test_release_checklist_retention_deletion(db_url: str, tmp_path: Path) -> None:
    """Seed 001 "Retention/deletion": retention jobs enforce deletion without removing
    active recovery evidence."""
    engine = db.create_engine(db_url)
    try:
        _stage(engine, "task-done", "done")
        _stage(engine, "task-held", "held")
        with SimProcess(tmp_path) as sim:
            result = run_once(write_config(tmp_path, db_url, {PROVIDER: http_provider(sim)}))
            assert result.returncode == 0, result.stderr[-2000:]
        _stage(engine, "task-wait", "waiting")  # unfinished: never dispatched
        with engine.begin() as conn:
            conn.execute(sa.text(
                "UPDATE outbox_tasks SET legal_hold_owner = 'legal@example', "
                "legal_hold_review_at = :r WHERE task_id = 'task-held'"),
                {"r": datetime(2020, 1, 1)})
        before = {o: _op(engine, o) for o in ("done", "held", "waiting")}
        assert before["done"]["status"] == "applied" and before["done"]["receipt"]
        later = _db_now(engine) + timedelta(days=100)

        counts = purge(engine, PERIODS, now=later)
        assert (counts.payloads, counts.receipts, counts.retention_expired) == (1, 1, 1)
        assert (counts.held_tasks, counts.holds_overdue_review) == (1, 1)

        done = _op(engine, "done")
        assert done["payload"] is None and done["payload_purged_at"] is not None
        assert done["receipt"] is None and done["receipt_purged_at"] is not None
        assert done["payload_digest"] == before["done"]["payload_digest"] is not None
        assert (done["status"], done["idempotency_key"], done["attempts"]) == (
            "applied", before["done"]["idempotency_key"], 1)
        evidence = _records_of(engine, "done")
        assert len(evidence) >= 4  # the row, its attempt and its events remain
        assert all(CANARY not in repr(r) for r in evidence)

        held = _op(engine, "held")
        assert held["payload"] == {"note": CANARY} and held["receipt"] == before["held"]["receipt"]
        waiting = _op(engine, "waiting")
        assert waiting["payload"] == {"note": CANARY}  # what an unfinished op needs stays
        assert (waiting["status"], waiting["status_reason"]) == ("blocked", "retention_expired")
        assert [(e["from_status"], e["to_status"], e["reason"]) for e in rows(
            engine, "SELECT * FROM outbox_events WHERE operation_id = 'waiting'")] == [
            ("pending", "blocked", "retention_expired")]

        assert purge(engine, PERIODS, now=later).payloads == 0  # idempotent
        much_later = later + timedelta(days=1000)
        counts = purge(engine, PERIODS, now=much_later)
        assert counts.attempts == 1 and counts.events >= 3
        assert rows(engine, "SELECT * FROM outbox_attempts WHERE operation_id = 'done'") == []
        assert len(rows(engine, "SELECT * FROM outbox_attempts WHERE operation_id = 'held'")) == 1
        assert rows(engine, "SELECT * FROM outbox_events WHERE operation_id = 'waiting'")
        assert _op(engine, "done")["payload_digest"] == before["done"]["payload_digest"]
    finally:
        engine.dispose()


def test_dry_run_counts_and_changes_nothing(engine: Engine) -> None:
    _stage(engine, "k", "op")
    with engine.begin() as conn:
        api.cancel_task(conn, tenant_id="t1", task_id="k", actor="me")
    later = _db_now(engine) + timedelta(days=100)
    snapshot = rows(engine, "SELECT * FROM outbox_operations")
    counts = purge(engine, PERIODS, now=later, dry_run=True)
    assert counts.dry_run and counts.payloads == 1
    assert rows(engine, "SELECT * FROM outbox_operations") == snapshot
    assert purge(engine, PERIODS, now=later).payloads == 1


def test_the_rules_still_refuse_everyone_else(engine: Engine) -> None:
    _stage(engine, "k", "op")
    with engine.begin() as conn:
        conn.exec_driver_sql("INSERT INTO outbox_events (tenant_id, kind, actor, detail) "
                             "VALUES ('t1', 'note', 'x', '{\"a\": 1}')")
    null_payload = ("UPDATE outbox_operations SET payload = 'null', "
                    "payload_purged_at = '2030-01-01 00:00:00' WHERE operation_id = 'op'")
    with pytest.raises(errors.ImmutableField), mapped_errors(), engine.begin() as conn:
        conn.exec_driver_sql(null_payload)  # outside the retention path
    with pytest.raises(errors.ImmutableField), mapped_errors(), engine.begin() as conn:
        with retention_path(conn):  # inside it, but not a purge (no payload_purged_at)
            conn.exec_driver_sql("UPDATE outbox_operations SET payload = 'null'")
    with pytest.raises(errors.ImmutableField), mapped_errors(), engine.begin() as conn:
        with retention_path(conn):  # inside it, but a different body, not a purge
            conn.exec_driver_sql("UPDATE outbox_operations SET payload = '{\"x\": 1}', "
                                 "payload_purged_at = '2030-01-01 00:00:00'")
    with pytest.raises(errors.AppendOnly), mapped_errors(), engine.begin() as conn:
        with retention_path(conn):  # events: only the free-form detail may be minimised
            conn.exec_driver_sql("UPDATE outbox_events SET reason = 'rewritten'")
    with pytest.raises(errors.AppendOnly), mapped_errors(), engine.begin() as conn:
        conn.exec_driver_sql("UPDATE outbox_events SET detail = NULL")
    with engine.begin() as conn, retention_path(conn):
        conn.exec_driver_sql(null_payload)
    assert _op(engine, "op")["payload"] is None


def test_erase_tenant_keeps_minimised_evidence_only(engine: Engine) -> None:
    for tenant in ("gone", "kept"):
        _stage(engine, "k", "op", tenant=tenant)
        _stage(engine, "held", "op-held", tenant=tenant)
    with engine.begin() as conn:
        conn.exec_driver_sql("UPDATE outbox_tasks SET legal_hold_owner = 'legal' "
                             "WHERE task_id = 'held'")
        conn.exec_driver_sql("INSERT INTO outbox_events (tenant_id, task_id, operation_id, "
                             "kind, actor, detail) VALUES ('gone', 'k', 'op', 'note', 'x', "
                             f"'{{\"said\": \"{CANARY}\"}}')")
    digest = _op(engine, "op")["payload_digest"]
    dry = erase_tenant(engine, "gone", actor="dpo", reason="art. 17 request", dry_run=True)
    assert dry.payloads == 1 and dry.blocked == 1 and dry.held_tasks == 1
    counts = erase_tenant(engine, "gone", actor="dpo", reason="art. 17 request")
    assert (counts.payloads, counts.task_states, counts.event_details, counts.blocked) == (
        1, 1, 1, 1)

    gone = rows(engine, "SELECT * FROM outbox_operations WHERE tenant_id = 'gone' "
                "AND operation_id = 'op'")[0]
    assert _json(gone["payload"]) is None and gone["payload_digest"] == digest
    assert (gone["status"], gone["status_reason"]) == ("blocked", "tenant_erased")
    dump = repr(rows(engine, "SELECT * FROM outbox_operations WHERE tenant_id = 'gone' "
                     "AND operation_id = 'op'") + rows(
        engine, "SELECT * FROM outbox_events WHERE tenant_id = 'gone' AND task_id = 'k'") +
        rows(engine, "SELECT * FROM outbox_tasks WHERE tenant_id = 'gone' AND task_id = 'k'"))
    assert CANARY not in dump
    assert CANARY in repr(rows(engine, "SELECT * FROM outbox_operations WHERE "
                               "tenant_id = 'gone' AND operation_id = 'op-held'"))
    kept = rows(engine, "SELECT * FROM outbox_operations WHERE tenant_id = 'kept'")
    assert all(_json(r["payload"]) == {"note": CANARY} and r["status"] == "pending"
               for r in kept)
    erased = rows(engine, "SELECT * FROM outbox_events WHERE kind = 'tenant_erased'")
    assert [(e["tenant_id"], e["actor"], e["reason"]) for e in erased] == [
        ("gone", "dpo", "art. 17 request")]

    with engine.begin() as conn:  # an effect possibly under way: settle it first
        conn.exec_driver_sql("UPDATE outbox_operations SET status = 'unknown' "
                             "WHERE tenant_id = 'kept' AND operation_id = 'op'")
    with pytest.raises(ErasureRefused):
        erase_tenant(engine, "kept", actor="dpo", reason="r")


def test_cli_purge_and_erase(sqlite_url: str, tmp_path: Path) -> None:
    engine = db.create_engine(sqlite_url)
    try:
        _stage(engine, "k", "op")
    finally:
        engine.dispose()
    cfg = write_config(tmp_path, sqlite_url, {})
    base = [sys.executable, "-m", "dispatcher.cli"]

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*base, *args, "--config", str(cfg)], capture_output=True,
                              text=True, timeout=60, check=False)

    purged = run("purge", "--dry-run")
    assert purged.returncode == 0, purged.stderr
    assert '"dry_run": true' in purged.stdout and CANARY not in purged.stdout + purged.stderr
    erased = run("erase", "--tenant", "t1", "--actor", "dpo", "--reason", "request")
    assert erased.returncode == 0, erased.stderr
    assert '"payloads": 1' in erased.stdout and CANARY not in erased.stdout + erased.stderr


@pytest.mark.postgres
def test_the_retention_role_purges_once_per_cluster(secure_db: SecureDb) -> None:  # noqa: F811
    owner = db.create_engine(secure_db.url)
    retention = db.create_engine(secure_db.login("retention"))
    agent = db.create_engine(secure_db.login("agent"))
    try:
        _stage(agent, "k", "op")
        with agent.begin() as conn:
            api.cancel_task(conn, tenant_id="t1", task_id="k", actor="me")
        later = _db_now(owner) + timedelta(days=100)
        with pytest.raises(sa.exc.ProgrammingError) as caught:  # not the agent's job
            purge(agent, PERIODS, now=later)
        assert caught.value.orig.sqlstate == "42501"  # type: ignore[union-attr]

        job = RetentionJob(retention, RetentionConfig(**{**vars(PERIODS), "enabled": True}))
        with owner.connect() as holder:  # another replica is purging
            holder.begin()
            holder.execute(sa.select(sa.func.pg_advisory_xact_lock(int(ClusterLock.RETENTION))))
            assert job.run_once(now=later) is None
            holder.rollback()
        counts = job.run_once(now=later)
        assert counts is not None and counts.payloads == 1
        assert _op(owner, "op")["payload"] is None
    finally:
        for e in (owner, retention, agent):
            e.dispose()
