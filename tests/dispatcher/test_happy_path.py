"""The happy path on both dialects: staged through the agent API, drained by
``outboxd run --once`` against the real sim, each effect applied exactly once, with its
records (events and attempts) written."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy.engine import Engine

from tests.dispatcher import (
    PROVIDER,
    assert_once_each,
    attempts_of,
    drain_once,
    events_of,
    operations,
    stage,
)
from tests.support.daemon import http_provider, status_counts, write_config
from tests.support.sim import SimProcess

N = 200


@pytest.mark.slow
def test_run_once_applies_every_operation_once(db_url: str, engine: Engine, tmp_path: Path) -> None:
    ids = stage(engine, N, per_task=50)
    with SimProcess(tmp_path) as sim:
        cfg = write_config(tmp_path, db_url, {PROVIDER: http_provider(sim)})
        drain_once(cfg)

        assert status_counts(engine) == {"applied": N}
        assert_once_each(sim, ids)
        assert sim.stats()["requests"] == N  # no retries were needed

    ops = operations(engine)
    for op in ops.values():
        assert op["attempts"] == 1
        assert op["receipt"]  # the receiver's evidence
        assert op["lease_expires_at"] is None  # no lease left behind
        assert op["first_dispatched_at"] is not None
        assert op["last_outcome"] == "applied"

    attempts = attempts_of(engine)
    assert len(attempts) == N
    assert {a["operation_id"] for a in attempts} == set(ids)
    assert {a["result_class"] for a in attempts} == {"applied"}
    assert {a["status_code"] for a in attempts} == {201}
    assert all(a["fencing_token"] == ops[a["operation_id"]]["fencing_token"] for a in attempts)

    path: dict[str, list[tuple[str, str]]] = {}
    for e in events_of(engine):
        path.setdefault(e["operation_id"], []).append((e["from_status"], e["to_status"]))
    assert set(path) == set(ids)
    expected = [("pending", "claimed"), ("claimed", "dispatching"), ("dispatching", "applied")]
    assert all(p == expected for p in path.values())
