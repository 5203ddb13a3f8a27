"""examples/plain_sql/, run through the real ``sqlite3`` and ``psql`` clients: an agent
with no Python stages its effect with a compare-and-set in one transaction; a crash before
COMMIT leaves nothing; re-running the step stages nothing twice; ``outboxd run --once``
dispatches it exactly once to a real ``outboxd sim``."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.foundation.sqlcli import CliError, dialect_of, run_cli
from tests.support.daemon import http_provider, run_once, write_config
from tests.support.sim import REPO_ROOT, SimProcess

pytestmark = pytest.mark.slow
SCRIPTS = {
    "sqlite": REPO_ROOT / "examples" / "plain_sql" / "sqlite_agent.sql",
    "postgresql": REPO_ROOT / "examples" / "plain_sql" / "psql_agent.sql",
}
KEY = "acme:ticket:create:case-8472"


def rows(url: str) -> list[list[str]]:
    return run_cli(url, "SELECT operation_id, status, idempotency_key FROM outbox_operations;")


def test_plain_sql_agent_stages_once_and_is_dispatched_once(tmp_path: Path, db_url: str) -> None:
    script = SCRIPTS[dialect_of(db_url)].read_text()
    # The agent dies inside its transaction (any error before COMMIT): nothing is staged.
    crashed = script.split("COMMIT;")[0] + "SELECT no_such_column FROM outbox_tasks;\n"
    with pytest.raises(CliError):
        run_cli(db_url, crashed)
    assert rows(db_url) == []
    assert run_cli(db_url, "SELECT count(*) FROM outbox_tasks;") == [["0"]]

    first = run_cli(db_url, script)
    assert first == [["case-8472", "1", "ticket-requested", "ticket:create:case-8472",
                      "pending", KEY]]
    assert run_cli(db_url, script) == first  # a restarted agent repeats its step: no-op

    with SimProcess(tmp_path) as sim:
        cfg = write_config(tmp_path, db_url, {"tickets": http_provider(sim)})
        done = run_once(cfg)
        assert done.returncode == 0, done.stdout + done.stderr
        assert rows(db_url) == [["ticket:create:case-8472", "applied", KEY]]
        run_cli(db_url, script)  # and again after dispatch: still nothing new to send
        stats = sim.stats()
    assert stats["effects_per_key"] == {KEY: 1}
    assert stats["duplicates"] == 0
    assert rows(db_url) == [["ticket:create:case-8472", "applied", KEY]]
