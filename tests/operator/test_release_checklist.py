"""Seed 001's release checklist, line "Provider reconciliation/object validation": unknown
effects trigger reconciliation or review, not blind retries; referenced objects are
available, authorised and integrity-checked. Real ``outboxd run --once`` processes against
two real sim receivers (one drops every response after applying)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import sqlalchemy as sa

from outbox import approvals, db, migrate, recovery
from outbox.digest import payload_digest
from outbox.recovery import Step
from tests.dispatcher import drain_once
from tests.operator import TENANT, stage
from tests.support.daemon import http_provider, write_config
from tests.support.sim import SimProcess


def _statuses(engine: sa.Engine) -> dict[str, tuple[str, str | None]]:
    with engine.connect() as conn:
        rows = conn.execute(sa.text(
            "SELECT operation_id, status, status_reason FROM outbox_operations")).all()
    return {r[0]: (r[1], r[2]) for r in rows}


@pytest.mark.slow
def test_release_checklist_provider_reconciliation_and_object_validation(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'outbox.db'}"
    engine = db.create_engine(url)
    migrate.upgrade(engine)
    store = tmp_path / "artifacts"
    (store / "a").mkdir(parents=True)
    good = {"doc": "contract", "pages": 3}
    (store / "a" / "good.json").write_text(json.dumps(good))
    (store / "a" / "tampered.json").write_text(json.dumps({"doc": "contract", "pages": 4}))
    with SimProcess(tmp_path, "--p-drop-after-apply", "1") as dropping, SimProcess(
        tmp_path
    ) as ok:
        nodedup = {"dedup_retention_seconds": 0, "timeout_seconds": 2}
        cfg = write_config(tmp_path, url, {
            "lookup": http_provider(dropping, **nodedup),
            "review": {k: v for k, v in http_provider(dropping, **nodedup).items()
                       if k != "lookup_url"},  # no look-up: only a person can decide
            "objects": http_provider(ok),
        })
        cfg.write_text(cfg.read_text() + f'\n[artifacts]\nroot = "{store}"\n')
        try:
            stage(engine, "task-unknown", ["u-lookup"], provider="lookup")
            stage(engine, "task-review", ["u-review"], provider="review")
            stage(engine, "task-objects", ["o-missing"], provider="objects",
                  payload=None, payload_ref="a/missing.json", payload_digest=payload_digest(good))
            stage(engine, "task-tamper", ["o-tampered"], provider="objects", payload=None,
                  payload_ref="a/tampered.json", payload_digest=payload_digest(good))
            stage(engine, "task-good", ["o-good"], provider="objects", payload=None,
                  payload_ref="a/good.json", payload_digest=payload_digest(good))
            stage(engine, "task-auth", ["o-unapproved", "o-approved"], provider="objects",
                  requires_approval=True)
            with engine.begin() as conn:
                approvals.approve(conn, tenant_id=TENANT, operation_id="o-approved",
                                  actor="alice")

            drain_once(cfg)  # ambiguous answers -> unknown: no blind re-send to a non-deduper
            first = _statuses(engine)
            assert first["u-lookup"][0] == "unknown" and first["u-review"][0] == "unknown"
            drain_once(cfg)  # reconciliation at start-up: look-up, or a person
            final = _statuses(engine)
        finally:
            drop_stats, ok_stats = dropping.stats(), ok.stats()

    assert final["u-lookup"] == ("applied", "reconciled_found")
    assert final["u-review"] == ("blocked", "needs_operator")
    assert drop_stats["requests"] == 2 and drop_stats["duplicates"] == 0  # one send each
    assert final["o-missing"] == ("blocked", "artifact_missing")
    assert final["o-tampered"] == ("blocked", "artifact_digest_mismatch")
    assert final["o-unapproved"] == ("blocked", "approval_missing")
    assert final["o-good"][0] == "applied" and final["o-approved"][0] == "applied"
    assert ok_stats["requests"] == 2  # substituted, missing or unauthorised: never sent

    with engine.connect() as conn:
        def step(task: str) -> Step:
            return recovery.plan(conn, tenant_id=TENANT, task_id=task).step

        assert step("task-review") == Step.ESCALATE  # review by a person
        assert step("task-unknown") == Step.CONTINUE  # reconciled with evidence
        assert step("task-objects") == Step.ESCALATE and step("task-tamper") == Step.ESCALATE
        plan = recovery.plan(conn, tenant_id=TENANT, task_id="task-auth")
    assert {o.operation_id: o.step for o in plan.operations} == {
        "o-unapproved": Step.REVALIDATE, "o-approved": Step.CONTINUE}
    engine.dispose()
