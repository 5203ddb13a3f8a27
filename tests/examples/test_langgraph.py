"""examples/langgraph/graph.py, as real processes on both dialects: a graph whose tool
node's effect commits with its checkpoint (``outbox.frameworks.langgraph``), an ``outboxd
run`` sidecar and an ``outboxd sim`` receiver. The graph, or the dispatcher, is SIGKILLed
at each point that matters; every run ends with the effect applied exactly once at the
receiver and the graph finishing with the receipt in its reply.

| kill | where |
|---|---|
| ``in-node`` | the graph, inside the tool node, before its save |
| ``after-commit`` | the graph, right after the tool node's save |
| ``while-waiting`` | the graph, while it waits for the receipt (the dispatcher down) |
| ``while-sending`` | the dispatcher, after the receiver applied, before it recorded |

An effect that needs an approval interrupts the graph; after the approval the resumed run
finishes with the receipt.
"""

from __future__ import annotations

import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa

import outbox
from outbox import db, overrides
from tests.dispatcher import FAST_PROVIDER, failpoints
from tests.support.daemon import DaemonProcess, http_provider, wait_until, write_config
from tests.support.sim import REPO_ROOT, SimProcess

GRAPH = REPO_ROOT / "examples" / "langgraph" / "graph.py"
THREAD = "support-42"
pytestmark = pytest.mark.slow


def graph(url: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(GRAPH), "--database", url, "--thread", THREAD, *args],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip


def operations(url: str) -> list[tuple[str, str]]:
    engine = db.create_engine(url)
    with engine.connect() as conn:
        rows = conn.execute(sa.text("SELECT operation_id, status FROM outbox_operations")).all()
    engine.dispose()
    return [(str(o), str(s)) for o, s in rows]


class Setup:
    def __init__(self, url: str, tmp_path: Path, sim: SimProcess) -> None:
        self.url, self.sim = url, sim
        self.config = write_config(tmp_path, url,
                                   {"tickets": http_provider(sim, **FAST_PROVIDER)},
                                   dispatcher={"lease_seconds": 1.0})

    def sidecar(self, spec: str | None = None) -> DaemonProcess:
        return DaemonProcess(self.config, env=failpoints(spec) if spec else None)

    def finished_once(self, done: subprocess.CompletedProcess[str]) -> str:
        """The graph finished with the receipt, and the receiver holds one effect."""
        assert done.returncode == 0, done.stdout + done.stderr
        [(op_id, status)] = operations(self.url)
        assert status == "applied"
        assert op_id.startswith(f"lg:{THREAD}:open_ticket:") and op_id.endswith(":ticket")
        stats = self.sim.stats()
        assert stats["effects_per_key"] == {f"acme:{op_id}": 1}
        assert stats["duplicates"] == 0
        reply = [line for line in done.stdout.splitlines() if "reply: ticket" in line]
        assert reply and "reply: ticket eff_" in reply[0], done.stdout  # the receipt's id
        return op_id


@pytest.fixture
def setup(db_url: str, tmp_path: Path) -> Iterator[Setup]:
    with SimProcess(tmp_path) as sim:
        yield Setup(db_url, tmp_path, sim)


@pytest.mark.parametrize("point", ["in-node", "after-commit"])
def test_a_graph_killed_around_its_save_resumes_to_one_effect(setup: Setup, point: str) -> None:
    crashed = graph(setup.url, "--crash", point)
    assert crashed.returncode == -signal.SIGKILL, crashed.stdout + crashed.stderr
    staged = operations(setup.url)
    # both or neither: nothing staged before the save; the effect with it after
    assert [s for _, s in staged] == ([] if point == "in-node" else ["pending"])
    with setup.sidecar():
        resumed = graph(setup.url)
    assert f"resuming thread {THREAD}" in resumed.stdout, resumed.stdout + resumed.stderr
    op_id = setup.finished_once(resumed)
    if staged:
        assert staged[0][0] == op_id  # the staged effect is the one sent
    again = graph(setup.url)
    assert "already finished: nothing is re-run" in again.stdout
    assert setup.sim.stats()["requests"] == 1


def test_a_graph_killed_while_it_waits_waits_again(setup: Setup) -> None:
    with subprocess.Popen(
        [sys.executable, str(GRAPH), "--database", setup.url, "--thread", THREAD],
        cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    ) as waiting:  # fmt: skip
        assert waiting.stdout is not None
        for line in waiting.stdout:  # no sidecar yet: it waits for good
            if "waiting for the receipt" in line:
                break
        waiting.send_signal(signal.SIGKILL)
        assert waiting.wait(timeout=30) == -signal.SIGKILL
    assert [s for _, s in operations(setup.url)] == ["pending"]
    with setup.sidecar():
        setup.finished_once(graph(setup.url))


def test_a_dispatcher_killed_while_it_sends_leaves_one_effect(setup: Setup) -> None:
    """The receiver applied; the dispatcher died before recording it. The next one finds
    the effect by looking it up (same key), records it, and the graph gets its receipt."""
    with setup.sidecar("after_send=kill") as first, subprocess.Popen(
        [sys.executable, str(GRAPH), "--database", setup.url, "--thread", THREAD],
        cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    ) as waiting:  # fmt: skip
        wait_until(lambda: not first.alive(), timeout=60, message="the send and the kill")
        assert setup.sim.stats()["requests"] == 1
        with setup.sidecar():
            out, _ = waiting.communicate(timeout=90)
        done = subprocess.CompletedProcess(waiting.args, waiting.returncode, out, "")
    setup.finished_once(done)


def test_an_unknown_effect_interrupts_and_a_resolution_resumes(
    db_url: str, tmp_path: Path
) -> None:
    """A receiver that applies, then drops the connection, with no look-up and no
    deduplication: the attempt is ambiguous and nobody can tell — ``unknown``, then
    ``blocked`` (``needs_operator``: with no look-up only a person can settle it), never
    re-sent. The graph asks a person; after ``resolve`` it goes on."""
    with SimProcess(tmp_path, "--p-drop-after-apply", "1.0") as sim:
        provider = {k: v for k, v in http_provider(sim, **FAST_PROVIDER).items()
                    if k != "lookup_url"}
        cfg = write_config(tmp_path, db_url, {"tickets": {**provider,
                                                          "dedup_retention_seconds": 0}})
        with DaemonProcess(cfg):
            held = graph(db_url, "--patience", "0.5")
            assert held.returncode == 3, held.stdout + held.stderr
            [(op_id, status)] = operations(db_url)
            assert status in ("unknown", "blocked")
            assert f"'status': '{status}'" in held.stdout
            engine = db.create_engine(db_url)
            with engine.begin() as conn:
                overrides.resolve(conn, tenant_id="acme", operation_id=op_id,
                                  outcome="applied", actor="ops@example",
                                  reason="seen in the ticket system", evidence="TICKET-1")
            engine.dispose()
            resumed = graph(db_url, "--patience", "0.5")
        assert resumed.returncode == 0, resumed.stdout + resumed.stderr
        assert f"{op_id} is applied" in resumed.stdout
        assert operations(db_url) == [(op_id, "applied")]
        stats = sim.stats()
    assert stats["effects_per_key"] == {f"acme:{op_id}": 1}  # sent once, never again
    assert stats["requests"] == 1


def test_the_demo_stages_crashes_resumes_and_replies_with_the_receipt() -> None:
    done = subprocess.run([sys.executable, str(GRAPH.with_name("demo.py"))], cwd=REPO_ROOT,
                          capture_output=True, text=True, timeout=180, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "crashing right after open_ticket's save" in done.stdout
    assert "is still pending" in done.stdout and "demo: OK" in done.stdout


def test_an_effect_that_needs_an_approval_interrupts_and_resumes(setup: Setup) -> None:
    with setup.sidecar():
        held = graph(setup.url, "--approval")
        assert held.returncode == 3, held.stdout + held.stderr
        assert "approval_missing" in held.stdout and "blocked" in held.stdout
        [(op_id, status)] = operations(setup.url)
        assert status == "blocked" and setup.sim.stats()["requests"] == 0
        engine = db.create_engine(setup.url)
        with engine.begin() as conn:
            outbox.approve(conn, tenant_id="acme", operation_id=op_id, actor="ops@example")
        engine.dispose()
        resumed = graph(setup.url)
    assert "resuming thread" in resumed.stdout
    assert setup.finished_once(resumed) == op_id
