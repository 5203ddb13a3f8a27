"""Migration 0004 upgrades a live 0003 database: rows in every operation state are upgraded
to head unchanged (only an index is rebuilt), the status index now holds the rows at rest
and none on the dispatch path, the gauges count every state as a plain count does, and a
real ``outboxd run --once`` dispatches them: pending ones applied, expired leases recovered
by the rules, rows at rest untouched. On both dialects."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Engine

from dispatcher.maintenance import gauges
from outbox import db, migrate
from tests.dispatcher import PROVIDER, effects, key_of, transitions
from tests.migration import database_at
from tests.migration.test_0002_upgrade import ROWS, TERMINAL, _insert_every_state, operations
from tests.support.daemon import http_provider, run_once, write_config
from tests.support.sim import SimProcess

INDEX = "ix_outbox_operations_status_updated"


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def at_0003(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    yield from database_at(request, tmp_path, "0003", _insert_every_state)


def _index_definition(engine: Engine) -> str:
    with engine.connect() as conn:
        if engine.dialect.name == "sqlite":
            sql = "SELECT sql FROM sqlite_master WHERE type = 'index' AND name = :n"
        else:
            sql = "SELECT indexdef FROM pg_indexes WHERE indexname = :n"
        return str(conn.execute(sa.text(sql), {"n": INDEX}).scalar_one())


@pytest.mark.slow
def test_0003_rows_in_every_state_survive_0004_and_dispatch(
    at_0003: str, tmp_path: Path
) -> None:
    engine = db.create_engine(at_0003)
    try:
        before = operations(engine)
        assert "WHERE" not in _index_definition(engine).upper()
        assert migrate.upgrade(engine) == migrate.head()
        migrate.check_current(engine)
        assert operations(engine) == before  # the upgrade itself changed no row
        partial = _index_definition(engine)
        assert "WHERE" in partial.upper() and "dispatching" in partial
        counted = gauges.refresh(engine)  # each part from its own index
        plain = Counter(str(r["status"]) for r in before.values())
        assert {s: n for s, n in counted.items() if n} == dict(plain)

        with SimProcess(tmp_path) as sim:
            result = run_once(write_config(tmp_path, at_0003, {PROVIDER: http_provider(sim)}))
            assert result.returncode == 0, result.stderr[-3000:]
            sent = effects(sim)
        after = operations(engine)

        for op_id in ("pending-1", "pending-2", "claimed"):
            assert after[op_id]["status"] == "applied", op_id
            assert sent.get(key_of(op_id)) == 1, op_id
        assert transitions(engine, "claimed")[0] == ("claimed", "pending")
        assert transitions(engine, "dispatching")[0] == ("dispatching", "unknown")
        for op_id in ("dispatching", "unknown"):  # reconciled by the rules, at most one effect
            assert after[op_id]["status"] in ("unknown", "applied", "pending", "blocked"), op_id
            assert sent.get(key_of(op_id), 0) <= 1, op_id
        for op_id in (*TERMINAL, "blocked"):  # untouched
            assert after[op_id] == before[op_id], op_id
            assert key_of(op_id) not in sent, op_id
        assert set(after) == set(ROWS)
        assert gauges.refresh(engine)["applied"] == sum(
            1 for r in after.values() if r["status"] == "applied")
    finally:
        engine.dispose()
