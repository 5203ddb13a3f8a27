"""A receiver that answers 409 "in flight" forever for one key (its idempotency record of
a request that died half-way holds the key) ends ``blocked`` ``receiver_stuck_in_flight``
once the budget is spent — not ``budget_exhausted``, which the runbook explains as
retryable failures — with every attempt on the same key and no effect."""

from __future__ import annotations

import contextlib
import sqlite3
import time
from pathlib import Path

import pytest
from sqlalchemy.engine import Engine

from tests.dispatcher import config, key_of, operation, stage, wire_sha256
from tests.support.daemon import DaemonProcess, wait_until
from tests.support.sim import SimProcess


@pytest.mark.slow
def test_409_until_the_budget_ends_is_its_own_blocked_reason(
    db_url: str, engine: Engine, tmp_path: Path
) -> None:
    (op_id,) = stage(engine, 1, max_attempts=3)
    body = {"n": 0, "op": op_id, "note": "hello"}  # what stage() writes
    with SimProcess(tmp_path) as sim:
        # the receiver's record of an earlier request under this key that never finished
        with contextlib.closing(sqlite3.connect(sim.ledger_path)) as ledger, ledger:
            ledger.execute(
                "INSERT INTO sim_keys (key, body_sha256, state, created_at) "
                "VALUES (?, ?, 'in_flight', ?)",
                (key_of(op_id), wire_sha256(body), time.time()))
        with DaemonProcess(config(tmp_path, db_url, sim, lease_seconds=5)):
            wait_until(lambda: operation(engine, op_id)["status"] == "blocked", timeout=60,
                       message="blocked")
        stats = sim.stats()
    row = operation(engine, op_id)
    assert (row["status_reason"], row["last_outcome"], row["attempts"]) == (
        "receiver_stuck_in_flight", "in_flight", 3)
    assert stats["in_flight_conflicts"] == 3 and stats["effects_per_key"] == {}
