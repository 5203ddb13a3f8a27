"""examples/langgraph/graph.py with LangGraph's SQLite checkpointer, as real processes:
the tool node is SIGKILLed after staging; resuming the thread re-runs the node, derives
the same operation id, and its regenerated payload is refused (PayloadMismatch) instead of
sent; a finished thread re-runs nothing. The sim counts one effect."""

from __future__ import annotations

import importlib.util
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import sqlalchemy as sa

from outbox import db
from tests.support.daemon import http_provider, run_once, write_config
from tests.support.sim import REPO_ROOT, SimProcess

GRAPH = REPO_ROOT / "examples" / "langgraph" / "graph.py"


def _missing() -> list[str]:
    missing = []
    for name in ("langgraph", "langgraph.checkpoint.sqlite"):
        try:
            found = importlib.util.find_spec(name) is not None
        except ModuleNotFoundError:
            found = False
        if not found:
            missing.append(name)
    return missing


MISSING = _missing()
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(bool(MISSING), reason=(
        f"LangGraph example NOT RUN: {', '.join(MISSING)} not installed "
        "(pip install -e '.[langgraph]')")),
]


def graph(url: str, checkpoints: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(GRAPH), "--database", url, "--checkpoints", str(checkpoints),
         "--thread", "support-42", "--case", "case-8472", *args],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=90, check=False,
    )


def operations(url: str) -> list[tuple[str, str]]:
    engine = db.create_engine(url)
    with engine.connect() as conn:
        rows = conn.execute(sa.text("SELECT operation_id, status FROM outbox_operations")).all()
    engine.dispose()
    return [(str(o), str(s)) for o, s in rows]


def test_resumed_tool_node_cannot_repeat_or_replace_the_effect(
    tmp_path: Path, sqlite_url: str
) -> None:
    checkpoints = tmp_path / "graph.sqlite"
    crashed = graph(sqlite_url, checkpoints, "--crash")
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr
    [(op_id, status)] = operations(sqlite_url)
    assert op_id.startswith("lg:support-42:open_ticket:") and op_id.endswith(":ticket")
    assert status == "pending"

    resumed = graph(sqlite_url, checkpoints)
    assert resumed.returncode == 0, resumed.stderr
    assert "resuming thread support-42 at open_ticket" in resumed.stdout
    assert f"regenerated payload refused (PayloadMismatch) for {op_id}" in resumed.stdout
    assert operations(sqlite_url) == [(op_id, "pending")]

    with SimProcess(tmp_path) as sim:
        cfg = write_config(tmp_path, sqlite_url, {"tickets": http_provider(sim)})
        assert run_once(cfg).returncode == 0
        again = graph(sqlite_url, checkpoints)
        assert "already finished: nothing is re-run" in again.stdout, again.stdout + again.stderr
        stats = sim.stats()
    assert stats["effects_per_key"] == {f"acme:{op_id}": 1}
    assert stats["duplicates"] == 0
    assert operations(sqlite_url) == [(op_id, "applied")]
