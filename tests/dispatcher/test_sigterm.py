"""SIGTERM while sends are in flight: ``outboxd run`` stops claiming, waits up to
``shutdown_grace_seconds`` for what is in flight, exits 0, and nothing is lost: what
finished is recorded, what did not is left recoverable (lease -> unknown -> look-up)."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest
from sqlalchemy.engine import Engine

from tests.dispatcher import (
    all_status,
    assert_once_each,
    both,
    config,
    engine_at,
    stage,
    url_for,
)
from tests.support.daemon import DaemonProcess, status_counts, wait_until
from tests.support.sim import SimProcess

N = 12


@pytest.mark.slow
@pytest.mark.parametrize(
    ("dialect", "case"),
    [*both("grace-covers-sends"), *both("grace-shorter-than-sends")],
)
def test_sigterm_exits_0_within_grace_and_loses_nothing(
    request: pytest.FixtureRequest, tmp_path: Path, dialect: str, case: str
) -> None:
    db_url = url_for(request, dialect)
    with engine_at(db_url) as engine:
        _sigterm(engine, db_url, tmp_path, covers=case == "grace-covers-sends")


def _sigterm(engine: Engine, db_url: str, tmp_path: Path, *, covers: bool) -> None:
    ids = stage(engine, N)
    slow, grace = (1.0, 6.0) if covers else (4.0, 0.5)
    sim_args = ("--p-slow", "1.0", "--slow-seconds", str(slow))
    with SimProcess(tmp_path, *sim_args) as sim:
        cfg = config(
            tmp_path, db_url, sim, lease_seconds=3, timeout_seconds=slow + 2,
            in_flight_seconds=slow + 2,
            dispatcher={"concurrency": 4, "batch_size": 4, "shutdown_grace_seconds": grace},
        )  # fmt: skip
        with DaemonProcess(cfg) as d:
            wait_until(
                lambda: status_counts(engine).get("dispatching", 0) > 0,
                timeout=20,
                message="sends in flight",
            )
            t0 = time.monotonic()
            d.signal(signal.SIGTERM)
            code = d.wait(timeout=grace + 15)
            took = time.monotonic() - t0
        assert code == 0
        # a little over the grace period is the process's own exit; not a full send
        assert took < grace + (2.5 if covers else slow), took
        left = status_counts(engine)
        assert left.get("claimed", 0) == 0  # nothing half-claimed
        if covers:
            assert left.get("dispatching", 0) == 0  # everything in flight was recorded
            assert left.get("applied", 0) > 0
        assert sum(left.values()) == N
        # a restarted replica finishes the job: nothing lost, nothing doubled
        sim.control(p_slow=0.0)
        with DaemonProcess(cfg):
            wait_until(all_status(engine, "applied", N), timeout=30, message="drained")
        assert_once_each(sim, ids)
