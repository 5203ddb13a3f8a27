"""Migration 0003 upgrades a live 0002 database: rows in every operation state, plus rows
stored before the door existed that it would now refuse (nested too deep, a timestamp
Python cannot hold), are upgraded to head unchanged and then dispatched by a real
``outboxd run --once``: good rows as before, the old over-limit rows parked
``payload_undecodable`` (or, for a clamped ``infinity`` deadline, applied), none of them
refused by the upgrade. New inserts of the same values are refused. On both dialects."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy.engine import Engine

from outbox import db, errors, migrate
from outbox.db import mapped_errors
from tests.dispatcher import PROVIDER, effects, key_of, rows
from tests.migration import database_at
from tests.migration.test_0002_upgrade import ROWS, TERMINAL, _insert_every_state
from tests.support.daemon import http_provider, run_once, write_config
from tests.support.sim import SimProcess

DEEP = '{"a": ' + "[" * 80 + "]" * 80 + "}"


def _old_rows(dialect: str) -> dict[str, tuple[str, str]]:
    """operation id -> (column, SQL literal) stored before 0003, and what they become."""
    pg = dialect == "postgresql"
    return {
        "old-deep": ("payload", f"CAST('{DEEP}' AS jsonb)" if pg else f"'{DEEP}'"),
        "old-deadline": ("deadline_at", "'infinity'" if pg else "'tomorrow'"),
    }


def _expected(dialect: str) -> dict[str, tuple[str, str | None]]:
    return {
        "old-deep": ("blocked", "payload_undecodable"),
        # PostgreSQL: an infinity deadline reads as the latest datetime, so it never passes
        "old-deadline": ("applied", None) if dialect == "postgresql"
        else ("blocked", "payload_undecodable"),
    }


def _insert(engine: Engine, operation_id: str, column: str, literal: str) -> None:
    pg = engine.dialect.name == "postgresql"
    payload = """CAST('{"ok": 1}' AS jsonb)""" if pg else """'{"ok": 1}'"""
    values = {"payload": payload, column: literal}
    with engine.begin() as conn:
        conn.exec_driver_sql(
            "INSERT INTO outbox_operations (tenant_id, task_id, operation_id, provider, "
            f"{', '.join(values)}) VALUES ('t1', 'old', '{operation_id}', '{PROVIDER}', "
            f"{', '.join(values.values())})"
        )


def _fill(engine: Engine) -> None:
    _insert_every_state(engine)
    for op_id, (column, literal) in _old_rows(engine.dialect.name).items():
        _insert(engine, op_id, column, literal)


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def at_0002(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    yield from database_at(request, tmp_path, "0002", _fill)


def _statuses(engine: Engine) -> dict[str, tuple[str, str | None, int]]:
    # not the payload: the old deep row is what the door now refuses
    return {
        str(r["operation_id"]): (str(r["status"]), r["status_reason"], int(r["attempts"]))
        for r in rows(engine, "SELECT operation_id, status, status_reason, attempts "
                              "FROM outbox_operations")
    }


@pytest.mark.slow
def test_0002_rows_in_every_state_survive_0003_and_dispatch(
    at_0002: str, tmp_path: Path
) -> None:
    engine = db.create_engine(at_0002)
    dialect = engine.dialect.name
    try:
        before = _statuses(engine)
        assert migrate.upgrade(engine) == migrate.head()
        migrate.check_current(engine)
        assert _statuses(engine) == before  # the upgrade itself changed no row
        for op_id, (column, literal) in _old_rows(dialect).items():  # the door is shut now
            with pytest.raises(errors.PayloadUndecodable), mapped_errors():
                _insert(engine, f"new-{op_id}", column, literal)

        with SimProcess(tmp_path) as sim:
            result = run_once(write_config(tmp_path, at_0002, {PROVIDER: http_provider(sim)}))
            assert result.returncode == 0, result.stderr[-3000:]
            sent = effects(sim)
        after = _statuses(engine)

        for op_id in ("pending-1", "pending-2", "claimed"):
            assert after[op_id][0] == "applied", op_id
            assert sent.get(key_of(op_id)) == 1, op_id
        for op_id in ("dispatching", "unknown"):  # reconciled by the rules, at most one effect
            assert after[op_id][0] in ("unknown", "applied", "pending", "blocked"), op_id
            assert sent.get(key_of(op_id), 0) <= 1, op_id
        for op_id in (*TERMINAL, "blocked"):  # untouched
            assert after[op_id] == before[op_id], op_id
            assert key_of(op_id) not in sent, op_id
        for op_id, (status, reason) in _expected(dialect).items():
            assert after[op_id][:2] == (status, reason), op_id
            assert sent.get(key_of(op_id), 0) == (1 if status == "applied" else 0), op_id
        assert set(before) == set(ROWS) | set(_old_rows(dialect))
    finally:
        engine.dispose()
