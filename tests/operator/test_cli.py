"""``outboxd ops`` as real processes: outputs, ``--json``, exit codes, payload hiding and
tenant defaulting. Independent commands run concurrently to keep the suite quick."""

from __future__ import annotations

import json
from pathlib import Path

import sqlalchemy as sa

from outbox import db, migrate
from tests.operator import make_blocked, make_dispatching, make_unknown, run_all, stage
from tests.support.daemon import write_config

CANARY = "canary-7f3a9c-never-printed"


def _status(engine: sa.Engine, op: str) -> str:
    with engine.connect() as conn:
        return str(conn.execute(sa.text(
            "SELECT status FROM outbox_operations WHERE operation_id = :o"), {"o": op}
        ).scalar_one())


def test_ops_commands(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'outbox.db'}"
    engine = db.create_engine(url)
    migrate.upgrade(engine)
    cfg = write_config(tmp_path, url, {"sim": {"kind": "null"}})
    try:
        stage(engine, "task-b", ["op-b"])
        make_blocked(engine)
        stage(engine, "task-u", ["op-u"], payload={"note": CANARY})
        make_unknown(engine)
        stage(engine, "task-d", ["op-d"])
        make_dispatching(engine)
        stage(engine, "task-p", ["op-p1", "op-p2"])

        (lst, lst_json, show, show_json, reveal, plan_json, plan_txt, missing, no_evidence) = (
            run_all(
            ["ops", "list"],
            ["ops", "list", "--json", "--status", "unknown", "--status", "blocked"],
            ["ops", "show", "op-u"],
            ["ops", "show", "op-u", "--json"],
            ["ops", "show", "op-u", "--show-payload", "--actor", "alice", "--reason", "audit"],
            ["ops", "plan", "task-u", "--json"],
            ["ops", "plan", "task-p"],
            ["ops", "show", "no-such-op"],
            ["ops", "resolve", "op-u", "--outcome", "applied", "--actor", "a", "--reason", "r"],
            config=cfg,
        ))
        assert lst[0] == 0 and "op-u" in lst[1] and "op-p2" in lst[1] and "status" in lst[1]
        assert lst_json[0] == 0
        assert {r["operation_id"]: r["status"] for r in json.loads(lst_json[1])} == {
            "op-u": "unknown", "op-b": "blocked"}
        assert show[0] == 0 and "lease_expired_while_dispatching" in show[1]
        assert "attempts:" in show[1] and "events:" in show[1]
        assert show_json[0] == 0
        report = json.loads(show_json[1])
        assert report["operation"]["status"] == "unknown" and report["events"]
        for out in (lst[1], lst_json[1], show[1], show_json[1], plan_json[1]):
            assert CANARY not in out
        assert reveal[0] == 0 and CANARY in reveal[1]  # only with --show-payload (audited)
        [record] = json.loads(plan_json[1])
        assert record["operation_id"] == "op-u" and record["phase"] == "reconcile_effect"
        assert record["effect_status"] == "unknown" and record["schema_version"] == 1
        assert plan_txt[0] == 0 and "revalidate" in plan_txt[1] and "op-p1" in plan_txt[1]
        assert missing[0] == 1 and "No such operation" in missing[2]
        assert no_evidence[0] == 2 and "--evidence" in no_evidence[2]

        resolved, refused, requeued, task_cancel = run_all(
            ["ops", "resolve", "op-u", "--outcome", "applied", "--actor", "alice",
             "--reason", "seen in CRM", "--evidence", "crm://8472"],
            ["ops", "cancel", "op-d", "--actor", "bob", "--reason", "stop"],
            ["ops", "requeue", "op-b", "--actor", "carol", "--reason", "fixed"],
            ["ops", "cancel", "--task", "task-p", "--actor", "dave", "--reason", "abandon"],
            config=cfg,
        )
        assert resolved[0] == 0 and "unknown -> applied" in resolved[1]
        assert refused[0] == 1 and "cannot be recalled" in refused[2]
        assert requeued[0] == 0 and "blocked -> pending" in requeued[1]
        assert task_cancel[0] == 0 and "2 operation(s) cancelled" in task_cancel[1]
        assert [_status(engine, o) for o in ("op-u", "op-d", "op-b", "op-p1")] == [
            "applied", "dispatching", "pending", "cancelled"]
        with engine.connect() as conn:
            ev = conn.execute(sa.text(
                "SELECT actor, reason, evidence_ref FROM outbox_events WHERE kind = 'override' "
                "AND operation_id = 'op-u'")).one()
        assert tuple(ev) == ("alice", "seen in CRM", "crm://8472")

        stage(engine, "task-x", ["op-x"], tenant="t2")  # a second tenant: ambiguity
        [ambiguous] = run_all(["ops", "show", "op-u"], config=cfg)
        assert ambiguous[0] == 2 and "--tenant" in ambiguous[2]
    finally:
        engine.dispose()


def test_ops_show_of_a_payload_that_cannot_be_decoded_is_one_line(tmp_path: Path) -> None:
    """A row parked ``payload_undecodable`` (stored past the 0003 door) can be inspected:
    ``ops list`` and ``ops show`` work, and ``--show-payload`` says in one line why the
    body cannot be shown, never a traceback."""
    url = f"sqlite:///{tmp_path / 'outbox.db'}"
    engine = db.create_engine(url)
    migrate.upgrade(engine)
    cfg = write_config(tmp_path, url, {"sim": {"kind": "null"}})
    with engine.begin() as conn:
        conn.exec_driver_sql("DROP TRIGGER outbox_operations_shape")
        conn.exec_driver_sql(
            "INSERT INTO outbox_operations (tenant_id, task_id, operation_id, provider, "
            "payload, receipt, status, status_reason) VALUES ('t1', 'k', 'op-x', 'sim', "
            f"'{{\"n\": {'7' * 5000}}}', '{{\"r\": {'7' * 5000}}}', 'blocked', "
            "'payload_undecodable')")
    engine.dispose()
    lst, show, reveal = run_all(
        ["ops", "list"],
        ["ops", "show", "op-x"],
        ["ops", "show", "op-x", "--show-payload", "--actor", "alice", "--reason", "look"],
        config=cfg,
    )
    assert lst[0] == 0 and "payload_undecodable" in lst[1]
    assert show[0] == 0 and "op-x" in show[1]
    assert reveal[0] != 0 and "Traceback" not in reveal[2]
    assert reveal[2].strip().splitlines() == [
        "outboxd: the stored payload cannot be decoded: an integer has more digits than "
        "Python parses (operation_id='op-x')"
    ]
