"""The resume decision procedure: each row of seed 000's table produced for real and read
back through ``outbox.recovery.plan``. Crash rows come from ``outboxd run`` processes
killed at failpoints (SQLite, against the real sim); the rest run on both dialects."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Engine

from dispatcher.maintenance.lease_recovery import LeaseRecovery
from dispatcher.store import store_for
from outbox import approvals, db, recovery, schema
from outbox.api import cancel_task
from outbox.errors import TaskNotFound
from outbox.recovery import Step
from tests.dispatcher import FAST_PROVIDER, config, db_now, drain_once, failpoints
from tests.operator import TENANT, make_blocked, make_unknown, stage
from tests.support.daemon import run_once, wait_until
from tests.support.sim import SimProcess

RECORD_KEYS = {"schema_version", "task_id", "workflow_version", "state_revision", "phase",
               "operation_id", "payload_ref", "effect_status", "receipt_ref",
               "authorization_ref", "limits_ref", "evidence_refs"}


def plan(engine: Engine, task: str) -> recovery.RecoveryPlan:
    with engine.connect() as conn:
        return recovery.plan(conn, tenant_id=TENANT, task_id=task)


def steps(p: recovery.RecoveryPlan) -> dict[str, Step]:
    return {o.operation_id: o.step for o in p.operations}


@pytest.fixture(scope="module")
def sim(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimProcess]:
    with SimProcess(tmp_path_factory.mktemp("sim")) as s:
        yield s


def test_plan_rows_without_a_crash(engine: Engine) -> None:
    with engine.begin() as conn:  # computation incomplete, nothing staged: recompute
        from outbox.api import advance

        advance(conn, "task-think", tenant_id=TENANT, expected_revision=0, phase="thinking",
                workflow_version="wf-3")
    p = plan(engine, "task-think")
    assert p.step == Step.RECOMPUTE and not p.operations
    [rec] = p.records()
    assert set(rec) >= RECORD_KEYS and rec["phase"] == "recompute"
    assert rec["workflow_version"] == "wf-3" and rec["state_revision"] == 1

    stage(engine, "task-appr", ["op-appr"], requires_approval=True)  # never eligible
    p = plan(engine, "task-appr")
    [o] = p.operations
    assert o.step == Step.REVALIDATE and o.evidence.approval == "missing"
    with engine.begin() as conn:
        a = approvals.approve(conn, tenant_id=TENANT, operation_id="op-appr", actor="alice")
    [o] = plan(engine, "task-appr").operations
    assert o.evidence.approval == "valid"
    assert o.record["authorization_ref"] == f"outbox_approvals/{a.approval.id}"

    stage(engine, "task-unk", ["op-unk"])  # dispatch possible, outcome absent: reconcile
    make_unknown(engine)
    [o] = plan(engine, "task-unk").operations
    assert o.step == Step.RECONCILE and o.evidence.status_reason == (
        "lease_expired_while_dispatching")
    assert o.record["phase"] == "reconcile_effect" and o.record["effect_status"] == "unknown"
    assert o.record["receipt_ref"] is None and o.record["evidence_refs"]

    stage(engine, "task-blk", ["op-blk"])  # missing evidence: preserve the block, escalate
    make_blocked(engine)
    [o] = plan(engine, "task-blk").operations
    assert (o.step, o.evidence.status_reason) == (Step.ESCALATE, "needs_operator")

    with engine.begin() as conn:  # cancelled task: escalate, nothing dispatched
        cancel_task(conn, tenant_id=TENANT, task_id="task-appr", actor="ops", reason="stop")
    p = plan(engine, "task-appr")
    assert p.cancelled and p.step == Step.ESCALATE
    assert steps(p) == {"op-appr": Step.ESCALATE}
    with engine.connect() as conn, pytest.raises(TaskNotFound):
        recovery.plan(conn, tenant_id=TENANT, task_id="no-such-task")


@pytest.mark.slow
def test_crash_rows_through_the_real_dispatcher(tmp_path: Path, sim: SimProcess) -> None:
    url = f"sqlite:///{tmp_path / 'outbox.db'}"
    from outbox import migrate

    engine = db.create_engine(url)
    migrate.upgrade(engine)
    try:
        stage(engine, "task-crash", ["crash-1"], tenant=TENANT)
        cfg = config(tmp_path, url, sim, lease_seconds=1.0)
        before = sim.stats()["requests"]

        # Killed after claiming, before the dispatching commit: the claim was held in that
        # transaction, so nothing was committed and the row is pending for the next one.
        r = run_once(cfg, env=failpoints("after_claim_commit=kill"))
        assert r.returncode != 0
        [o] = plan(engine, "task-crash").operations
        assert (o.evidence.status, o.step) == ("pending", Step.REVALIDATE)
        assert o.evidence.attempts == 0

        # A committed claim (the store's claim without ``held``) whose worker died: claimed.
        with engine.begin() as conn:
            assert store_for("sqlite").claim(
                conn, worker="gone", limit=1, lease_seconds=1.0).rows
        [o] = plan(engine, "task-crash").operations
        assert (o.evidence.status, o.step) == ("claimed", Step.REVALIDATE)

        # The claim's lease expires; recovery returns the never-sent row to pending (waiting
        # for it here, rather than relying on the next process starting slowly enough).
        wait_until(lambda: LeaseRecovery(engine, actor="test").run_once()
                   .returned_to_pending == 1, timeout=10)

        # Stop after "dispatch may have occurred" was committed, before the call.
        r = run_once(cfg, env=failpoints("after_dispatching_commit=kill"))
        assert r.returncode != 0
        [o] = plan(engine, "task-crash").operations
        assert (o.evidence.status, o.step) == ("dispatching", Step.RECONCILE)
        assert o.evidence.attempts == 1 and sim.stats()["requests"] == before  # never sent

        recover = LeaseRecovery(engine, actor="test")
        wait_until(lambda: recover.run_once() is not None and plan(
            engine, "task-crash").operations[0].evidence.status == "unknown", timeout=10)
        [o] = plan(engine, "task-crash").operations
        assert (o.evidence.status, o.step) == ("unknown", Step.RECONCILE)

        # Resume: reconciliation (not found, counted in_flight_seconds after the row became
        # unknown) -> one send.
        with engine.connect() as conn:
            became_unknown = conn.execute(
                sa.select(schema.operations.c.updated_at)).scalar_one()
        counts_from = became_unknown + timedelta(
            seconds=FAST_PROVIDER["in_flight_seconds"])
        wait_until(lambda: db_now(engine) >= counts_from, timeout=10)
        drain_once(cfg)
        p = plan(engine, "task-crash")
        [o] = p.operations
        assert (o.evidence.status, o.step) == ("applied", Step.CONTINUE)  # no verifier
        assert o.record["receipt_ref"] is not None
        stats = sim.stats()
        assert stats["requests"] == before + 1 and stats["duplicates"] == 0
    finally:
        engine.dispose()


@pytest.mark.slow
def test_partial_batch_is_recovered_per_operation(tmp_path: Path, sim: SimProcess) -> None:
    url = f"sqlite:///{tmp_path / 'outbox.db'}"
    from outbox import migrate

    engine = db.create_engine(url)
    migrate.upgrade(engine)
    tenant = TENANT
    try:
        stage(engine, "task-batch", ["batch-ok"], tenant=tenant)
        with engine.begin() as conn:
            from outbox.api import StagedOperation, advance

            advance(conn, "task-batch", tenant_id=tenant, expected_revision=1, phase="more",
                    operations=[
                        StagedOperation("batch-v2", "sim", {"v": 2}, payload_schema=2),
                        StagedOperation("batch-art", "sim", payload_ref="gone/a.json",
                                        payload_digest="sha256:" + "0" * 64),
                        StagedOperation("batch-404", "bad", {"n": 404}),
                    ])
        cfg = config(tmp_path, url, sim)
        text = cfg.read_text() + (
            f'\n[providers.bad]\nkind = "http"\nurl = "{sim.url}/_nope"\n'
            "dedup_retention_seconds = 86400\n")
        cfg.write_text(text)
        drain_once(cfg)

        p = plan(engine, "task-batch")
        assert p.partial_batch and p.step == Step.RECOVER_EACH
        assert steps(p) == {"batch-ok": Step.CONTINUE, "batch-v2": Step.ESCALATE,
                            "batch-art": Step.ESCALATE, "batch-404": Step.ACCEPT_REFUSAL}
        reasons = {o.operation_id: o.evidence.status_reason for o in p.operations}
        assert reasons["batch-v2"] == "incompatible_version"
        assert reasons["batch-art"] == "artifact_missing"
        records = {r["operation_id"]: r for r in p.records()}
        assert records["batch-art"]["payload_ref"] == "gone/a.json"
        assert records["batch-ok"]["phase"] == "continue_from_result"
        with engine.connect() as conn:
            sent = conn.execute(sa.text("SELECT count(*) FROM outbox_attempts")).scalar_one()
        assert sent == 2  # the blocked ones were never sent
    finally:
        engine.dispose()
