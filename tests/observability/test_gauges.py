"""The database gauges and ``outboxd status`` on both dialects, and the gauge job's
queries on PostgreSQL: index range scans bounded by the backlog, never a scan of the
table (``EXPLAIN``)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Engine

from dispatcher import status
from dispatcher.config import load_config
from dispatcher.maintenance import gauges
from dispatcher.observability.metrics import REGISTRY
from dispatcher.store import common
from outbox import db, schema
from outbox.types import db_now
from tests.support.daemon import REPO_ROOT, write_config

ops = schema.operations


def _insert(engine: Engine, rows: list[dict[str, Any]]) -> None:
    with engine.begin() as conn:
        now = conn.execute(sa.select(db_now())).scalar_one()
        for i, r in enumerate(rows):
            row: dict[str, Any] = {"tenant_id": "t1", "task_id": "task", "operation_id": f"g-{i}",
                   "provider": "p", "payload": {"i": i}}
            for key in ("created_at", "next_attempt_at", "lease_expires_at"):
                if key in r:
                    row[key] = now + timedelta(seconds=r.pop(key))
            row.update(r)
            conn.execute(ops.insert().values(**row))


@pytest.fixture
def populated(engine: Engine) -> Engine:
    _insert(engine, [
        {"created_at": -100},                                    # due since creation
        {"created_at": -1000, "next_attempt_at": 3600},          # waiting for its back-off
        {"created_at": -500, "next_attempt_at": -30},            # retry due for 30 s
        {"status": "blocked", "status_reason": "approval_missing"},
        {"status": "blocked", "status_reason": "approval_missing"},
        {"status": "blocked"},
        {"status": "unknown", "status_reason": "lease_expired"},
        {"status": "dispatching", "fencing_token": 7, "lease_owner": "host-a:12",
         "lease_expires_at": 30},
        {"status": "applied"}, {"status": "applied"}, {"status": "applied"},
    ])
    return engine


def _value(name: str, **labels: str) -> float | None:
    return REGISTRY.get_sample_value(name, labels)


def test_gauges_are_read_from_the_database(populated: Engine) -> None:
    counts = gauges.GaugeRefresher(populated)()
    assert counts == {"pending": 3, "claimed": 0, "dispatching": 1, "unknown": 1, "blocked": 3,
                      "applied": 3, "verified": 0, "rejected": 0, "cancelled": 0}
    for s, n in counts.items():
        assert _value("outbox_operations", status=s) == n
    assert _value("outbox_unknown_operations") == 1
    assert _value("outbox_blocked_operations", reason="approval_missing") == 2
    assert _value("outbox_blocked_operations", reason="unspecified") == 1
    # the row created 100 s ago and never tried; not the one waiting for its back-off
    age = _value("outbox_oldest_pending_age_seconds")
    assert age is not None and 99 <= age < 160, age

    # a reason with no rows left loses its series; nothing due: age 0
    with populated.begin() as conn:
        conn.execute(ops.update().where(ops.c.status_reason == "approval_missing")
                     .values(status="cancelled"))
        conn.execute(ops.update().where(ops.c.status == "pending", ops.c.next_attempt_at.is_(None))
                     .values(status="applied"))
        conn.execute(ops.update().where(ops.c.status == "pending",
                                        ops.c.next_attempt_at < db_now())
                     .values(status="applied"))
    gauges.refresh(populated)
    assert _value("outbox_blocked_operations", reason="approval_missing") is None
    assert _value("outbox_blocked_operations", reason="unspecified") == 1
    assert _value("outbox_oldest_pending_age_seconds") == 0
    assert _value("outbox_operations", status="cancelled") == 2


def test_counts_that_grow_are_repeated_by_their_cost(populated: Engine) -> None:
    """``pending`` and the terminal counts are repeated only after 100 times their last
    duration; the live counts (leased, unknown, blocked) are read on every refresh."""
    ticks = [0.0]

    def clock() -> float:  # every reading 10 ms later: each count "costs" 10 ms
        ticks[0] += 0.01
        return ticks[0]

    refresher = gauges.GaugeRefresher(populated, clock=clock)
    first = refresher()
    assert (first["pending"], first["unknown"], first["applied"]) == (3, 1, 3)
    with populated.begin() as conn:
        conn.execute(ops.update().where(ops.c.status == "unknown").values(status="pending"))
    second = refresher()  # 1 s not passed: the pending series keeps its value
    assert "pending" not in second and "applied" not in second
    assert second["unknown"] == 0 and _value("outbox_unknown_operations") == 0
    assert _value("outbox_operations", status="pending") == 3
    ticks[0] += 1.0
    third = refresher()
    assert (third["pending"], third["applied"]) == (4, 3)
    assert _value("outbox_operations", status="pending") == 4


def test_status_table_and_json(populated: Engine, db_url: str, tmp_path: Path) -> None:
    with populated.connect() as conn:
        report = status.collect_from(conn)
    assert report["operations"]["pending"] == 3 and report["operations"]["blocked"] == 3
    assert 99 <= report["oldest_pending_age_seconds"] < 160
    assert report["oldest_pending_created_seconds_ago"] >= 1000
    assert report["blocked_by_reason"] == {"approval_missing": 2, "unspecified": 1}
    assert report["unknown_by_reason"] == {"lease_expired": 1}
    assert report["replicas_seen_recently"] == ["host-a:12"]
    assert report["replicas"][0]["leases"] == 1
    table = status.render(report)
    assert "approval_missing" in table and "host-a:12" in table and "leases    1" in table

    if not db_url.startswith("sqlite"):
        return  # the verb itself: once is enough
    cfg = write_config(tmp_path, db_url, {})
    out = subprocess.run(
        [sys.executable, "-m", "dispatcher.cli", "status", "--json", "--config", str(cfg)],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=60, check=False)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["operations"] == report["operations"]
    assert status.collect(load_config(cfg, env={}))["blocked_by_reason"] == report[
        "blocked_by_reason"]


# -- PostgreSQL plans ------------------------------------------------------------------

BIG = 20_000


@pytest.fixture
def big_pg(pg_url: str) -> Iterator[Engine]:
    engine = db.create_engine(pg_url)
    with engine.begin() as conn:
        conn.execute(sa.text(
            "INSERT INTO outbox_operations (tenant_id, task_id, operation_id, provider, payload,"
            " status, status_reason, next_attempt_at) "
            "SELECT 't', 'task' || (g / 50), 'op' || g, 'p', jsonb_build_object('n', g),"
            " CASE WHEN g % 200 = 0 THEN 'pending' WHEN g % 199 = 0 THEN 'blocked'"
            "      WHEN g % 197 = 0 THEN 'unknown' ELSE 'applied' END,"
            " CASE WHEN g % 199 = 0 THEN 'approval_missing' END,"
            " CASE WHEN g % 400 = 0 THEN now() + interval '1 minute' END "
            f"FROM generate_series(1, {BIG}) g"))
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(sa.text("VACUUM ANALYZE outbox_operations"))
    yield engine
    engine.dispose()


PARTIAL = {
    index.name
    for index in schema.operations.indexes
    if index.dialect_options["postgresql"]["where"] is not None
}


def _scans(plan: dict[str, Any]) -> Iterator[dict[str, Any]]:
    if plan.get("Relation Name") == "outbox_operations":
        yield plan
    for child in plan.get("Plans", []):
        yield from _scans(child)


@pytest.mark.postgres
def test_gauge_queries_use_indexes_bounded_by_the_backlog(big_pg: Engine) -> None:
    per_refresh = {
        "non-terminal counts": common.count_statement(gauges.NON_TERMINAL),
        "blocked by reason": common.blocked_statement(),
        "oldest due pending": common.oldest_due_pending_statement(),
    }
    with big_pg.connect() as conn:
        for what, stmt in per_refresh.items():
            sql = str(stmt.compile(conn, compile_kwargs={"literal_binds": True}))
            (plan,) = conn.execute(sa.text("EXPLAIN (FORMAT JSON) " + sql)).scalar_one()
            scans = list(_scans(plan["Plan"]))
            assert scans, what
            for scan in scans:
                assert scan["Node Type"] in ("Index Scan", "Index Only Scan"), (what, scan)
                # a range of an index, or the whole of a partial one (its predicate bounds it)
                assert scan.get("Index Cond") or scan["Index Name"] in PARTIAL, (what, scan)
                # estimated rows: the backlog (~300 rows), not the table (20 000)
                assert scan["Plan Rows"] < BIG / 10, (what, scan)
        refreshed = gauges.refresh(big_pg)
    assert refreshed["pending"] == BIG // 200 and refreshed["applied"] > BIG * 0.9
