"""examples/python_agent.py, run as real processes: the agent stages its ticket, is
SIGKILLed before continuing, restarts, follows ``recovery.plan`` and finishes without a
second ticket. Effects are counted at a real ``outboxd sim``."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest
import sqlalchemy as sa

from outbox import db
from tests.support.daemon import http_provider, run_once, write_config
from tests.support.sim import REPO_ROOT, SimProcess

AGENT = REPO_ROOT / "examples" / "python_agent.py"
pytestmark = pytest.mark.slow


def agent(url: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(AGENT), "--database", url, "--case", "case-8472", *args],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=60, check=False,
    )


def test_agent_crashes_resumes_from_plan_and_never_repeats_the_ticket(
    tmp_path: Path, sqlite_url: str
) -> None:
    with SimProcess(tmp_path) as sim:
        cfg = write_config(tmp_path, sqlite_url, {"tickets": http_provider(sim)})

        first = agent(sqlite_url, "--crash")
        assert first.returncode == -signal.SIGKILL, first.stderr
        assert "staged ticket:create:case-8472 at revision 1" in first.stdout

        waiting = agent(sqlite_url)  # restarted before the dispatcher ran
        assert waiting.returncode == 0, waiting.stderr
        assert "ticket:create:case-8472: revalidate" in waiting.stdout
        assert "refused (PayloadMismatch)" in waiting.stdout
        assert "waiting for outboxd: the ticket is pending" in waiting.stdout

        assert run_once(cfg).returncode == 0
        again = agent(sqlite_url)
        assert again.returncode == 0, again.stderr
        assert "ticket:create:case-8472: continue" in again.stdout
        assert "staged message:send:case-8472 at revision 2" in again.stdout

        assert run_once(cfg).returncode == 0
        last = agent(sqlite_url)
        assert "done: ticket eff_" in last.stdout, last.stdout
        assert "opened once and the customer was told" in last.stdout

        stats = sim.stats()
    assert stats["effects_per_key"] == {
        "acme:ticket:create:case-8472": 1, "acme:message:send:case-8472": 1}
    assert stats["duplicates"] == 0
    engine = db.create_engine(sqlite_url)
    with engine.connect() as conn:
        rows = dict(conn.execute(sa.text(
            "SELECT operation_id, status FROM outbox_operations")).all())
        revision, phase = conn.execute(sa.text(
            "SELECT state_revision, phase FROM outbox_tasks")).one()
    engine.dispose()
    assert rows == {"ticket:create:case-8472": "applied", "message:send:case-8472": "applied"}
    assert (revision, phase) == (2, "customer-notified")
