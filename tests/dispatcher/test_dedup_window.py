"""The receiver's deduplication window: a re-send with the same key is safe only while
the receiver still remembers the key. Past it, the dispatcher looks the effect up, or
blocks for a person; it never re-sends blindly (here the sim forgets keys after 2 s, so
a blind re-send would create a second effect)."""

from __future__ import annotations

import signal
from datetime import timedelta
from pathlib import Path

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Engine

from tests.dispatcher import (
    all_status,
    assert_once_each,
    attempts_of,
    both,
    config,
    db_now,
    engine_at,
    events_of,
    failpoints,
    is_stopped,
    operation,
    stage,
    status_of,
    transitions,
    url_for,
)
from tests.support.daemon import DaemonProcess, wait_until
from tests.support.sim import SimProcess

pytestmark = pytest.mark.slow
RETENTION = 2.0
SIM = ("--retention-seconds", str(RETENTION))


def window_passed(engine: Engine, op_id: str) -> bool:
    first = operation(engine, op_id)["first_dispatched_at"]
    return first is not None and db_now(engine) > first + timedelta(seconds=RETENTION + 0.2)


def stop_until_window_passed(engine: Engine, d: DaemonProcess, op_id: str) -> None:
    wait_until(lambda: is_stopped(d.pid), timeout=20, message="replica stopped")
    wait_until(lambda: window_passed(engine, op_id), timeout=10, message="window passed")


@pytest.mark.parametrize("dialect", both())
def test_ambiguous_outcome_recorded_after_the_window_goes_to_lookup(
    request: pytest.FixtureRequest, tmp_path: Path, dialect: str
) -> None:
    db_url = url_for(request, dialect)
    with engine_at(db_url) as engine:
        _ambiguous_outcome_recorded_after_the_window_goes_to_lookup(engine, db_url, tmp_path)


def _ambiguous_outcome_recorded_after_the_window_goes_to_lookup(
    engine: Engine, db_url: str, tmp_path: Path
) -> None:
    """The replica holds an ambiguous outcome (response dropped after applying) while
    SIGSTOPped past the window; on resuming it records ``unknown``, not a retry."""
    (op_id,) = stage(engine, 1)
    with SimProcess(tmp_path, *SIM, "--p-drop-after-apply", "1.0") as sim:
        cfg = config(tmp_path, db_url, sim, lease_seconds=10, dedup_retention_seconds=RETENTION)
        with DaemonProcess(cfg, env=failpoints("after_send=stop")) as d:
            stop_until_window_passed(engine, d, op_id)
            d.signal(signal.SIGCONT)
            wait_until(all_status(engine, "applied", 1), timeout=20, message="applied")
        assert_once_each(sim, [op_id])
        assert sim.stats()["requests"] == 1
    assert transitions(engine, op_id)[2:] == [("dispatching", "unknown"), ("unknown", "applied")]
    unknown, found = events_of(engine, op_id)[2:]
    assert unknown["reason"] == "dedup_window_passed"
    assert (found["kind"], found["reason"]) == ("reconciliation", "reconciled_found")
    assert [a["result_class"] for a in attempts_of(engine, op_id)] == ["ambiguous"]


@pytest.mark.parametrize("dialect", both())
def test_blind_retry_claimed_after_the_window_is_refused_before_sending(
    request: pytest.FixtureRequest, tmp_path: Path, dialect: str
) -> None:
    db_url = url_for(request, dialect)
    with engine_at(db_url) as engine:
        _blind_retry_claimed_after_the_window_is_refused_before_sending(engine, db_url, tmp_path)


def _blind_retry_claimed_after_the_window_is_refused_before_sending(
    engine: Engine, db_url: str, tmp_path: Path
) -> None:
    """An ambiguous attempt was scheduled for a retry inside the window; the replica is
    SIGSTOPped right after claiming that retry and resumes past the window: the checks
    refuse the blind re-send (``unknown``) and the look-up finds the effect."""
    (op_id,) = stage(engine, 1)
    with SimProcess(tmp_path, *SIM, "--p-drop-after-apply", "1.0") as sim:
        cfg = config(tmp_path, db_url, sim, lease_seconds=10, dedup_retention_seconds=RETENTION)
        # SQLite: the stopped replica's held claim keeps the file's write lock, and the
        # outbox's engine begins every transaction IMMEDIATE; a plain reader (WAL) does not
        reader = sa.create_engine(db_url) if engine.dialect.name == "sqlite" else engine
        with DaemonProcess(cfg, env=failpoints("after_claim_commit=stop@2")) as d:
            try:
                stop_until_window_passed(reader, d, op_id)
                # the claim is held in the marking transaction: nothing committed yet
                assert status_of(reader, op_id) == "pending"
            finally:
                if reader is not engine:
                    reader.dispose()
            d.signal(signal.SIGCONT)
            wait_until(all_status(engine, "applied", 1), timeout=20, message="applied")
        assert_once_each(sim, [op_id])
        assert sim.stats()["requests"] == 1
    assert transitions(engine, op_id) == [
        ("pending", "claimed"),
        ("claimed", "dispatching"),
        ("dispatching", "pending"),  # ambiguous, inside the window: retry planned
        ("pending", "claimed"),
        ("claimed", "unknown"),  # past the window: refused before sending
        ("unknown", "applied"),
    ]
    assert events_of(engine, op_id)[4]["reason"] == "dedup_window_passed"
    row = operation(engine, op_id)
    assert row["attempts"] == 1


@pytest.mark.parametrize(("dialect", "mode"), [*both("lookup"), *both("no-lookup")])
def test_replica_stopped_past_the_window_is_taken_over_without_resending(
    request: pytest.FixtureRequest, tmp_path: Path, dialect: str, mode: str
) -> None:
    db_url = url_for(request, dialect)
    with engine_at(db_url) as engine:
        _taken_over(engine, db_url, tmp_path, lookup=mode == "lookup")


def _taken_over(engine: Engine, db_url: str, tmp_path: Path, *, lookup: bool) -> None:
    """Replica A sends and is SIGSTOPped before recording, past its lease and the window;
    replica B takes over: with a look-up the effect is found (``applied``), without one
    the row is ``blocked`` for a person. Never a second request."""
    (op_id,) = stage(engine, 1)
    with SimProcess(tmp_path, *SIM) as sim:
        extra = {} if lookup else {"lookup_url": None}
        cfg_a = config(
            tmp_path, db_url, sim, worker_id="a", name="a.toml",
            dedup_retention_seconds=RETENTION, **extra,
        )  # fmt: skip
        cfg_b = config(
            tmp_path, db_url, sim, worker_id="b", name="b.toml",
            dedup_retention_seconds=RETENTION, **extra,
        )  # fmt: skip
        with DaemonProcess(cfg_a, env=failpoints("after_send=stop")) as a:
            stop_until_window_passed(engine, a, op_id)
            with DaemonProcess(cfg_b):
                want = "applied" if lookup else "blocked"
                wait_until(all_status(engine, want, 1), timeout=20, message=want)
        assert sim.stats()["requests"] == 1
        assert_once_each(sim, [op_id])
    row = operation(engine, op_id)
    if lookup:
        assert row["receipt"]["reconciled"] is True
    else:
        assert row["status_reason"] == "needs_operator"
    assert transitions(engine, op_id)[2] == ("dispatching", "unknown")
