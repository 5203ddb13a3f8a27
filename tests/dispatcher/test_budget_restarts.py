"""A retry budget survives restarts: it lives in the row (``attempts``,
``first_dispatched_at``), not in the memory of a process that keeps dying."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy.engine import Engine

from tests.dispatcher import (
    attempts_of,
    both,
    config,
    engine_at,
    failpoints,
    key_of,
    operation,
    stage,
    transitions,
    url_for,
)
from tests.support.daemon import DaemonProcess, wait_until
from tests.support.sim import SimProcess

MAX_ATTEMPTS = 3


@pytest.mark.slow
@pytest.mark.parametrize("dialect", both())
def test_budget_is_not_reset_by_a_daemon_killed_after_every_attempt(
    request: pytest.FixtureRequest, tmp_path: Path, dialect: str
) -> None:
    db_url = url_for(request, dialect)
    with engine_at(db_url) as engine:
        _budget_is_not_reset_by_a_daemon_killed_after_every_attempt(engine, db_url, tmp_path)


def _budget_is_not_reset_by_a_daemon_killed_after_every_attempt(
    engine: Engine, db_url: str, tmp_path: Path
) -> None:
    (op_id,) = stage(engine, 1)
    with SimProcess(tmp_path, "--p-503", "1.0", "--retry-after", "0") as sim:
        cfg = config(tmp_path, db_url, sim, max_attempts=MAX_ATTEMPTS)

        def done() -> bool:
            row = operation(engine, op_id)
            return row["status"] == "blocked" or (
                row["status"] == "unknown" and row["status_reason"] == "budget_exhausted"
            )

        lives = 0
        while not done():
            lives += 1
            assert lives <= MAX_ATTEMPTS + 3, f"never settled: {operation(engine, op_id)}"
            # each life sends (at most) once and is SIGKILLed before recording the answer
            with DaemonProcess(cfg, env=failpoints("after_send=kill")) as d:
                wait_until(lambda d=d: not d.alive() or done(), timeout=20, message="a life")
        stats = sim.stats()
        assert stats["requests"] <= MAX_ATTEMPTS
        assert stats["faults"].get("503", 0) == stats["requests"]
        assert sim.stats()["effects_per_key"].get(key_of(op_id), 0) == 0

    row = operation(engine, op_id)
    assert (row["status"], row["status_reason"]) == ("blocked", "budget_exhausted")
    assert row["attempts"] == stats["requests"] == MAX_ATTEMPTS
    assert lives == MAX_ATTEMPTS + 1  # the last life only found the budget spent
    path = transitions(engine, op_id)
    assert path.count(("claimed", "dispatching")) == MAX_ATTEMPTS
    assert path[-1] == ("claimed", "blocked")
    # every killed attempt is accounted for, by lease recovery
    assert [a["result_class"] for a in attempts_of(engine, op_id)] == ["lost"] * MAX_ATTEMPTS
