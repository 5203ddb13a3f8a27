"""Artifacts resolved through the local store (missing or substituted → a visible block,
never sent), workflow/payload-schema versions, and the pluggable pre-dispatch policy."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from outbox.digest import payload_digest
from outbox.protection.artifacts import (
    InvalidReference,
    LocalArtifactStore,
    check_ref,
    store_payload,
)
from tests.authority import (
    PROVIDER,
    approve,
    blocked_event,
    config,
    detail_of,
    effects_of,
    operation,
    reason_of,
    rows,
    stage_task,
)
from tests.dispatcher import engine_for
from tests.support.daemon import DaemonProcess, http_provider, run_once, wait_until, write_config
from tests.support.sim import SimProcess


def _requeue(engine: sa.Engine, *op_ids: str) -> None:
    with engine.begin() as conn:
        for op_id in op_ids:
            conn.execute(sa.text(
                "UPDATE outbox_operations SET status = 'pending', status_reason = NULL, "
                "state_revision = state_revision + 1 WHERE operation_id = :o"), {"o": op_id})


def test_references_are_relative_paths_inside_the_store(tmp_path: Path) -> None:
    for bad in ("", "/etc/passwd", "../x.json", "a/../../x", "a//b", "./a", "a\\b", "a\x00b"):
        with pytest.raises(InvalidReference):
            check_ref(bad)
    store = LocalArtifactStore(tmp_path / "store")
    (tmp_path / "outside.json").write_text("{}")
    (tmp_path / "store").mkdir()
    (tmp_path / "store" / "link.json").symlink_to(tmp_path / "outside.json")
    with pytest.raises(InvalidReference):
        store.read("link.json")
    digest = store_payload(store, "case/1.json", {"b": 1, "a": [1, 2]})
    assert digest == payload_digest({"a": [1, 2], "b": 1})
    assert json.loads(store.read("case/1.json")) == {"a": [1, 2], "b": 1}


@pytest.mark.slow
def test_artifacts_missing_or_substituted_are_blocked_never_sent(
    db_url: str, tmp_path: Path
) -> None:
    engine = engine_for(db_url)
    root = tmp_path / "artifacts"
    store = LocalArtifactStore(root)
    big = {"ticket": {"body": "x" * 4000, "case": "8472"}}
    refs = {name: f"case-8472/{name}.json" for name in ("ok", "approved", "missing", "swapped")}
    digests = {name: store_payload(store, ref, {**big, "name": name}) for name, ref in
               refs.items()}
    try:
        ops: dict[str, dict[str, Any]] = {
            f"art-{n}": {"payload_ref": refs[n], "payload_digest": digests[n]} for n in refs
        }
        ops["art-approved"]["requires_approval"] = True
        ops["art-escape"] = {"payload_ref": "../outside.json", "payload_digest": digests["ok"]}
        stage_task(engine, "case-8472", ops)
        approve(engine, "art-approved")
        (root / refs["missing"]).unlink()
        (root / refs["swapped"]).write_text(json.dumps({**big, "name": "swapped", "x": 1}))
        with SimProcess(tmp_path) as sim:
            cfg = config(tmp_path, db_url, sim, artifacts=root)
            result = run_once(cfg)
            assert result.returncode == 0, result.stderr[-2000:]
            assert {op: reason_of(engine, op) for op in ops} == {
                "art-ok": ("applied", None), "art-approved": ("applied", None),
                "art-missing": ("blocked", "artifact_missing"),
                "art-swapped": ("blocked", "artifact_digest_mismatch"),
                "art-escape": ("blocked", "artifact_missing"),
            }
            for op in ("art-missing", "art-swapped", "art-escape"):
                assert effects_of(sim, op) == 0
            assert "invalid reference" in detail_of(blocked_event(engine, "art-escape"))["detail"]
            sent = rows(engine, "SELECT operation_id, request_digest FROM outbox_attempts")
            assert {r["operation_id"]: r["request_digest"] for r in sent} == {
                "art-ok": digests["ok"], "art-approved": digests["approved"]}
            assert sim.stats()["requests"] == 2
            assert operation(engine, "art-ok")["payload"] is None  # the row stays small
    finally:
        engine.dispose()


@pytest.mark.slow
def test_incompatible_versions_block_until_a_replica_supports_them(
    sqlite_url: str, tmp_path: Path
) -> None:
    engine = engine_for(sqlite_url)
    try:
        stage_task(engine, "t3", {"v3-op": {}}, workflow_version="support-follow-up-v3")
        stage_task(engine, "t4", {"v4-op": {}}, workflow_version="support-follow-up-v4")
        stage_task(engine, "ts", {"schema2": {"payload_schema": 2}},
                   workflow_version="support-follow-up-v3")
        with SimProcess(tmp_path) as sim:
            old = config(tmp_path, sqlite_url, sim, workflow_versions=["support-follow-up-v3"])
            assert run_once(old).returncode == 0
            assert reason_of(engine, "v3-op") == ("applied", None)
            assert reason_of(engine, "v4-op") == ("blocked", "incompatible_version")
            assert reason_of(engine, "schema2") == ("blocked", "incompatible_version")
            assert detail_of(blocked_event(engine, "v4-op")) == {
                "workflow_version": "support-follow-up-v4", "supported": ["support-follow-up-v3"]}
            assert effects_of(sim, "v4-op") == 0 and effects_of(sim, "schema2") == 0
            new = config(tmp_path, sqlite_url, sim, payload_schemas=[1, 2],
                         workflow_versions=["support-follow-up-v3", "support-follow-up-v4"])
            _requeue(engine, "v4-op", "schema2")  # what `outboxd ops requeue` does
            assert run_once(new).returncode == 0
            assert reason_of(engine, "v4-op") == ("applied", None)
            assert reason_of(engine, "schema2") == ("applied", None)
            assert sim.stats()["duplicates"] == 0
    finally:
        engine.dispose()


@pytest.mark.slow
@pytest.mark.timeout(360)
def test_policy_is_rechecked_before_every_send_and_resend(
    sqlite_url: str, tmp_path: Path
) -> None:
    engine = engine_for(sqlite_url)
    try:
        stage_task(engine, "t", {"small": {"payload": {"amount": 75}},
                                 "big": {"payload": {"amount": 500}},
                                 "resend": {"provider": "second", "payload": {"amount": 1}}})
        with SimProcess(tmp_path, "--p-503", "1", "--retry-after", "0.2") as sim:
            bad = write_config(tmp_path, sqlite_url, {PROVIDER: http_provider(
                sim, policy="tests.authority.policies:no_such_policy")})
            result = run_once(bad)
            assert result.returncode == 2 and "providers.sim.policy" in result.stderr
            cfg = write_config(tmp_path, sqlite_url, {
                PROVIDER: http_provider(sim, policy="tests.authority.policies:amount_limit"),
                "second": http_provider(sim, policy="tests.authority.policies:review_resends"),
            })
            with DaemonProcess(cfg):
                def resend_answered_503() -> bool:
                    # attempts counts from the "dispatching" mark, before the send: wait for
                    # the 503 to be recorded, or the sim could answer the first send with 200
                    row = operation(engine, "resend")
                    return bool(row["attempts"] == 1 and row["status"] in ("pending", "blocked"))

                wait_until(resend_answered_503, timeout=90,
                           message="the first send of resend answered with 503")
                sim.control(p_503=0.0)

                def small_due_now() -> bool:
                    # "small" may sit in jittered back-off (up to a minute) after the 503s:
                    # the test advances its clock rather than waiting the back-off out
                    with engine.begin() as conn:
                        conn.execute(sa.text(
                            "UPDATE outbox_operations SET next_attempt_at = NULL"
                            " WHERE operation_id = 'small' AND status = 'pending'"))
                    return True

                try:
                    wait_until(lambda: small_due_now()
                               and reason_of(engine, "small")[0] == "applied"
                               and reason_of(engine, "resend")[0] == "blocked", timeout=180,
                               message="small applied and resend blocked")
                except AssertionError as exc:
                    state = {op: (operation(engine, op)["status"],
                                  operation(engine, op)["status_reason"],
                                  operation(engine, op)["attempts"])
                             for op in ("small", "big", "resend")}
                    raise AssertionError(f"{exc}; now {state}") from None
            assert reason_of(engine, "big") == ("blocked", "policy_denied")
            assert detail_of(blocked_event(engine, "big")) == {
                "policy": "tests.authority.policies:amount_limit",
                "denial": "amount 500 is over the limit of 100"}
            assert reason_of(engine, "resend") == ("blocked", "policy_denied")
            assert detail_of(blocked_event(engine, "resend"))["denial"] == (
                "a re-send needs a fresh review")
            assert effects_of(sim, "big") == 0 and effects_of(sim, "resend") == 0
            assert effects_of(sim, "small") == 1
    finally:
        engine.dispose()
