"""A blind re-send checks the receiver's dedup window again right before the request
leaves: one delayed past it (here a real pause of the process between the ``dispatching``
commit and the send) is not made, and the row goes to ``unknown`` for reconciliation
instead of creating a second effect at a receiver that has forgotten the key.

Found by the chaos suite (seed 20240601): the window was open at the ``dispatching``
commit and closed by the time the delayed request reached the receiver."""

from __future__ import annotations

from pathlib import Path

import pytest
import sqlalchemy as sa

import outbox
from outbox import db
from tests.support.daemon import http_provider, run_once, write_config
from tests.support.sim import SimProcess


@pytest.mark.slow
def test_blind_resend_delayed_past_the_window_is_not_sent(db_url: str, tmp_path: Path) -> None:
    engine = db.create_engine(db_url)
    two_seconds_ago = ("now() - interval '2 seconds'" if engine.dialect.name == "postgresql"
                       else "strftime('%Y-%m-%d %H:%M:%f000', 'now', '-2 seconds')")
    try:
        with engine.begin() as conn:
            outbox.enqueue(conn, tenant_id="t", task_id="k", operation_id="op",
                           provider="sim", payload={"n": 1})
            # An earlier attempt ended ambiguously 2 s ago: a re-send is blind, and with a
            # 20 s window less 10% margin it must leave within the next 16 seconds. The
            # daemon's start-up and claim take part of that (seconds on a loaded machine:
            # with a 10 s window the claim itself once came too late), and the pause below
            # outlasts what is left whenever the claim comes.
            conn.execute(sa.text(
                "UPDATE outbox_operations SET last_outcome = 'ambiguous', attempts = 1, "
                f"first_dispatched_at = {two_seconds_ago}"))
        with SimProcess(tmp_path) as sim:
            cfg = write_config(tmp_path, db_url, {
                "sim": http_provider(sim, dedup_retention_seconds=20)})
            result = run_once(cfg, env={"OUTBOXD_FAILPOINTS": "after_dispatching_commit=sleep:17"})
            assert result.returncode == 0, result.stderr[-2000:]
            assert sim.stats()["requests"] == 0  # nothing left the process
        with engine.connect() as conn:
            status, reason = conn.execute(sa.text(
                "SELECT status, status_reason FROM outbox_operations")).one()
            evidence = conn.execute(sa.text("SELECT evidence FROM outbox_attempts")).scalar()
        assert (status, reason) == ("unknown", "dedup_window_passed")
        assert "not_sent" in str(evidence)
    finally:
        engine.dispose()
