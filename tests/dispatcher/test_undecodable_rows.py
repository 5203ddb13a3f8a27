"""Values a database stores but a driver or Python's JSON decoder cannot take (deep
nesting, bytes that are not UTF-8, integers longer than Python will parse) are one row's
problem: that row is parked ``blocked`` ``payload_undecodable``, never sent, and every
other row of its batch and of later batches is applied by the same running daemon."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from tests.dispatcher import assert_once_each, config, engine_for, events_of, key_of
from tests.support.daemon import DaemonProcess, settled, wait_until
from tests.support.sim import SimProcess

GOOD = [f"good-{i:02d}" for i in range(10)]
SHAPE_TRIGGER = "outbox_operations_shape"  # migration 0003


def _deep(levels: int) -> str:
    return '{"a": ' + "[" * levels + "]" * levels + "}"


def _undecodable(dialect: str) -> dict[str, dict[str, str]]:
    """operation id -> SQL expressions for columns the database accepts as stored but
    the dispatcher cannot decode (a row without ``payload`` gets a good one)."""
    long_int = '{"n": ' + "7" * 5000 + "}"  # Python refuses to parse over 4300 digits
    if dialect == "postgresql":
        return {
            "bad-deep": {"payload": f"CAST('{_deep(5000)}' AS jsonb)"},
            "bad-long-int": {"payload": f"CAST('{long_int}' AS jsonb)"},
            "bad-receipt": {"receipt": f"CAST('{long_int}' AS jsonb)"},
        }
    # SQLite: a TEXT value holding bytes that are not UTF-8 (0xff) inside a JSON string
    not_utf8 = b'{"note": "caf'.hex() + "ff" + b'"}'.hex()
    return {
        "bad-not-utf8": {"payload": f"CAST(X'{not_utf8}' AS TEXT)"},
        "bad-long-int": {"payload": f"'{long_int}'"},
        "bad-lone-surrogate": {"payload": """'{"s": "\\ud800"}'"""},
        "bad-receipt": {"receipt": f"'{long_int}'"},
        "bad-deadline": {"deadline_at": "'tomorrow'"},
        "bad-ordering-key": {"ordering_key": f"CAST(X'{not_utf8}' AS TEXT)"},
    }


def _timestamps(dialect: str) -> dict[str, tuple[dict[str, str], str]]:
    """operation id -> columns, and the status Python's clamped reading leads to."""
    if dialect != "postgresql":
        return {}
    return {
        "deadline-infinity": ({"deadline_at": "'infinity'"}, "applied"),
        "deadline-year-12000": ({"deadline_at": "'12000-01-01'"}, "applied"),
        "deadline-minus-infinity": ({"deadline_at": "'-infinity'"}, "blocked"),
    }


@contextlib.contextmanager
def _past_the_door(conn: Connection) -> Iterator[None]:
    """Insert as a row stored before migration 0003, or by a writer that bypasses its
    trigger: the dispatcher must still never be halted by it."""
    if conn.dialect.name == "postgresql":
        conn.exec_driver_sql(f"ALTER TABLE outbox_operations DISABLE TRIGGER {SHAPE_TRIGGER}")
        yield
        conn.exec_driver_sql(f"ALTER TABLE outbox_operations ENABLE TRIGGER {SHAPE_TRIGGER}")
        return
    sql = conn.exec_driver_sql(
        f"SELECT sql FROM sqlite_master WHERE name = '{SHAPE_TRIGGER}'"
    ).scalar_one()
    conn.exec_driver_sql(f"DROP TRIGGER {SHAPE_TRIGGER}")
    yield
    conn.exec_driver_sql(sql)


def _insert(engine: Engine, operation_id: str, columns: dict[str, str]) -> None:
    columns = {"payload": _good_payload(engine), **columns}
    names = ", ".join(columns)
    values = ", ".join(columns.values())
    with engine.begin() as conn, _past_the_door(conn):
        conn.execute(
            sa.text(
                f"INSERT INTO outbox_operations (tenant_id, task_id, operation_id, provider, "
                f"{names}) VALUES ('t1', 'raw-task', :op, 'sim', {values})"
            ),
            {"op": operation_id},
        )


def _good_payload(engine: Engine) -> str:
    good = """'{"ok": 1}'"""
    return f"CAST({good} AS jsonb)" if engine.dialect.name == "postgresql" else good


def _insert_good(engine: Engine, operation_id: str, n: int) -> None:
    cast = "CAST(:p AS jsonb)" if engine.dialect.name == "postgresql" else ":p"
    with engine.begin() as conn:
        conn.execute(
            sa.text(
                "INSERT INTO outbox_operations (tenant_id, task_id, operation_id, provider, "
                f"payload) VALUES ('t1', 'raw-task', :op, 'sim', {cast})"
            ),
            {"op": operation_id, "p": json.dumps({"n": n})},
        )


@pytest.mark.slow
def test_an_undecodable_row_is_parked_and_its_batch_is_dispatched(
    db_url: str, engine: Engine, tmp_path: Path
) -> None:
    bad = _undecodable(engine.dialect.name)
    times = _timestamps(engine.dialect.name)
    for i, op_id in enumerate(GOOD):
        _insert_good(engine, op_id, i)
        if i == 4:  # in the middle of the first batch
            for bad_id, columns in bad.items():
                _insert(engine, bad_id, columns)
            for op, (columns, _) in times.items():
                _insert(engine, op, columns)
    total = len(GOOD) + len(bad) + len(times)
    with SimProcess(tmp_path) as sim:
        cfg = config(tmp_path, db_url, sim, lease_seconds=5)
        with DaemonProcess(cfg) as d:
            wait_until(lambda: settled(engine, total), timeout=30, message="settled")
            assert d.alive()
            _insert_good(engine, "good-late", 99)  # still serving later batches
            wait_until(lambda: settled(engine, total + 1), timeout=30, message="late row")
            assert d.alive()
        applied = [op for op, (_, status) in times.items() if status == "applied"]
        assert_once_each(sim, [*GOOD, "good-late", *applied])
        assert not any(key_of(b) in sim.stats()["effects_per_key"] for b in bad)

    with engine.connect() as conn:  # not the payload: the test's own reader would fail on it
        ops = {
            r.operation_id: r._asdict()
            for r in conn.execute(sa.text(
                "SELECT operation_id, status, status_reason, attempts FROM outbox_operations"
            ))
        }
    for op, (_, status) in times.items():
        assert ops[op]["status"] == status, op
    for bad_id in bad:
        assert (ops[bad_id]["status"], ops[bad_id]["status_reason"]) == (
            "blocked",
            "payload_undecodable",
        ), bad_id
        assert ops[bad_id]["attempts"] == 0  # never sent
        blocked: list[dict[str, Any]] = [
            e for e in events_of(engine, bad_id) if e["to_status"] == "blocked"
        ]
        assert len(blocked) == 1
        detail = blocked[0]["detail"]
        if isinstance(detail, str):
            detail = json.loads(detail)
        assert detail["detail"]  # why, in words; never the body
        assert "7777" not in json.dumps(detail) and "caf" not in json.dumps(detail)


def _stuck(dialect: str, payload: str) -> dict[str, dict[str, str]]:
    """Rows left by a dead replica (an expired lease) or waiting for reconciliation
    (``unknown``), with ``payload``: lease recovery and reconciliation read them in
    batches, and one of them must not stop those passes either."""
    ago = ("now() - interval '10 seconds'" if dialect == "postgresql"
           else "strftime('%Y-%m-%d %H:%M:%f000', 'now', '-10 seconds')")
    lease = {"fencing_token": "1", "lease_owner": "'gone:1'", "lease_expires_at": ago}
    sent = {"attempts": "1", "first_dispatched_at": ago, "last_attempt_started_at": ago,
            "updated_at": ago, "last_outcome": "'ambiguous'"}
    return {
        "claimed": {"payload": payload, "status": "'claimed'", **lease},
        "dispatching": {"payload": payload, "status": "'dispatching'", **lease, **sent},
        "unknown": {"payload": payload, "status": "'unknown'", **sent},
    }


@pytest.mark.slow
def test_undecodable_rows_do_not_stop_lease_recovery_or_reconciliation(
    db_url: str, engine: Engine, tmp_path: Path
) -> None:
    dialect = engine.dialect.name
    bad_payload = next(iter(_undecodable(dialect).values()))["payload"]
    rows = {
        **{f"bad-{k}": v for k, v in _stuck(dialect, bad_payload).items()},
        **{f"good-{k}": v for k, v in _stuck(dialect, _good_payload(engine)).items()},
    }
    for op_id, columns in sorted(rows.items()):  # the bad ones first: they are read first
        _insert(engine, op_id, columns)
    with SimProcess(tmp_path) as sim:
        cfg = config(tmp_path, db_url, sim, lease_seconds=5)
        with DaemonProcess(cfg) as d:
            wait_until(lambda: settled(engine, len(rows)), timeout=60, message="settled")
            assert d.alive()
        # never sent before (the sim is new): each good row applied once, each bad one never
        assert_once_each(sim, [op for op in rows if op.startswith("good-")])
        assert not any(key_of(op) in sim.stats()["effects_per_key"]
                       for op in rows if op.startswith("bad-"))
    with engine.connect() as conn:
        got = dict(conn.execute(sa.text(
            "SELECT operation_id, status || ':' || COALESCE(status_reason, '') "
            "FROM outbox_operations")).all())
    for op_id in rows:
        if op_id.startswith("good-"):
            assert got[op_id].startswith("applied:"), (op_id, got[op_id])
        else:
            assert got[op_id] == "blocked:payload_undecodable", (op_id, got[op_id])


@pytest.mark.slow
def test_a_statement_error_is_not_taken_for_an_outage_and_dispatch_resumes(
    sqlite_url: str, tmp_path: Path
) -> None:
    """A cycle that fails on a statement (here: a table renamed away under the running
    daemon) is logged as ``dispatch cycle failed; retrying`` with its error class, never
    as ``database unavailable``; the daemon keeps running and dispatches once it can."""
    engine = engine_for(sqlite_url)
    try:
        with engine.begin() as conn:
            conn.exec_driver_sql("ALTER TABLE outbox_meta RENAME TO outbox_meta_away")
        _insert_good(engine, "good-after", 1)
        with SimProcess(tmp_path) as sim:
            cfg = config(tmp_path, sqlite_url, sim, lease_seconds=5)
            with DaemonProcess(cfg) as d:
                wait_until(lambda: "dispatch cycle failed; retrying" in d.log_text(),
                           timeout=30, message="the cycle error logged")
                assert d.alive()
                with engine.begin() as conn:
                    conn.exec_driver_sql("ALTER TABLE outbox_meta_away RENAME TO outbox_meta")
                wait_until(lambda: settled(engine, 1), timeout=30, message="dispatched")
                assert d.alive()
                log = d.log_text()
            assert_once_each(sim, ["good-after"])
        assert "database unavailable" not in log
        assert "Traceback" not in log
        line = next(json.loads(x) for x in log.splitlines()
                    if "dispatch cycle failed" in x)
        assert line["error"] == "OperationalError" and line["level"] == "error"
    finally:
        engine.dispose()
