"""Rows written with plain SQL are untrusted: each malformed one is parked ``blocked``
with its reason, every well-formed one is still applied, and the daemon keeps running."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Engine

from tests.dispatcher import assert_once_each, config, key_of, operations
from tests.support.daemon import DaemonProcess, settled, wait_until
from tests.support.sim import SimProcess

MAX_PAYLOAD_BYTES = 2048
AWS_KEY = "AKIA" + "Q3V7ZK2M9XW4B8TR"
BAD: dict[str, tuple[dict[str, Any], str]] = {
    "bad-array": ({"payload": [1, 2, 3]}, "payload_not_object"),
    "bad-string": ({"payload": "just text"}, "payload_not_object"),
    "bad-provider": ({"payload": {"a": 1}, "provider": "nope"}, "unknown_provider"),
    "bad-oversize": ({"payload": {"blob": "x" * (2 * MAX_PAYLOAD_BYTES)}}, "payload_too_large"),
    "bad-aws-key": ({"payload": {"note": f"use {AWS_KEY} please"}}, "credential_in_payload"),
    "bad-password": ({"payload": {"password": "hunter2hunter2"}}, "credential_in_payload"),
    "bad-digest": (
        {"payload": {"a": 1}, "payload_digest": "sha256:" + "0" * 64},
        "digest_mismatch",
    ),
    "bad-artifact": (
        {"payload": None, "payload_ref": "s3://nowhere/x", "payload_digest": "sha256:" + "1" * 64},
        "artifact_missing",
    ),
}
GOOD = [f"good-{i:02d}" for i in range(20)]


def insert_raw(engine: Engine, operation_id: str, **columns: Any) -> None:
    """``INSERT`` with only the required columns (and what ``columns`` adds), as an agent
    in another language would."""
    values: dict[str, Any] = {
        "tenant_id": "t1",
        "task_id": "raw-task",
        "operation_id": operation_id,
        "provider": "sim",
        **columns,
    }
    json_cast = "CAST(:payload AS jsonb)" if engine.dialect.name == "postgresql" else ":payload"
    names = ", ".join(values)
    params = ", ".join(json_cast if n == "payload" else f":{n}" for n in values)
    if values.get("payload") is not None:
        values["payload"] = json.dumps(values["payload"])
    with engine.begin() as conn:
        conn.execute(sa.text(f"INSERT INTO outbox_operations ({names}) VALUES ({params})"), values)


@pytest.mark.slow
def test_malformed_rows_are_blocked_and_the_rest_applied(
    db_url: str, engine: Engine, tmp_path: Path
) -> None:
    for i, op_id in enumerate(GOOD):
        insert_raw(engine, op_id, payload={"n": i})
        if i == 10:  # malformed rows in the middle of the queue
            for bad_id, (columns, _) in BAD.items():
                insert_raw(engine, bad_id, **columns)
    total = len(GOOD) + len(BAD)
    with SimProcess(tmp_path) as sim:
        cfg = config(
            tmp_path,
            db_url,
            sim,
            lease_seconds=5,
            database={"max_payload_bytes": MAX_PAYLOAD_BYTES},
        )
        with DaemonProcess(cfg) as d:
            wait_until(lambda: settled(engine, total), timeout=30, message="settled")
            assert d.alive()
            # still serving: a row staged now is dispatched too
            insert_raw(engine, "good-late", payload={"late": True})
            wait_until(lambda: settled(engine, total + 1), timeout=30, message="late row")
            assert d.alive()
        assert_once_each(sim, [*GOOD, "good-late"])
        assert sim.stats()["requests"] == len(GOOD) + 1
        assert not any(key_of(b) in sim.stats()["effects_per_key"] for b in BAD)

    ops = operations(engine)
    got = {o: (ops[o]["status"], ops[o]["status_reason"]) for o in BAD}
    assert got == {o: ("blocked", reason) for o, (_, reason) in BAD.items()}
    assert all(ops[o]["status"] == "applied" for o in [*GOOD, "good-late"])
    assert all(ops[o]["attempts"] == 0 for o in BAD)  # never sent
