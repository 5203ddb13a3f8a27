"""A short smoke of the benchmark harness, so ``make bench`` keeps working. It asserts that
each workload runs and produces a positive figure — never how fast it is."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench import daemon_runs, harness, latency, phases, raw, row_costs

pytestmark = [pytest.mark.postgres, pytest.mark.slow]


def test_harness_workloads_run(
    pg_admin_dsn: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(harness, "ADMIN_DSN", pg_admin_dsn)
    with harness.scratch_database("outboxd_smoke") as dsn:
        assert raw.commit_rate(dsn, 1, 0.2) > 0
        assert raw.raw_drain(dsn, 300, 100) > 0
        daemon_runs.prepare(dsn)
        daemon_runs.fill(dsn, 300)
        result = daemon_runs.drain(dsn, 300, batch=100, timeout=120)
        assert result["rows_per_s"] > 0
        assert "cpu_us_per_row" in result  # NaN when the drain ends before a second poll
        assert "server_cpu_us_per_row" in result
        assert daemon_runs.claim_latency_ms(dsn, samples=3) > 0
        daemon_runs.fill(dsn, 300, start=300)  # the backlog section: settled, then timed
        daemon_runs.settle(dsn)
        assert daemon_runs.drain_for(dsn, 3, batch=100) > 0
    p50, p99, rate = latency.checkpoint_cost(f"sqlite:///{tmp_path}/cp.db", 20)
    assert 0 < p50 <= p99 and rate > 0
    table = harness.table([harness.Figure("x", "rows/s", [1.0, 2.0])], [("r", 0.5, ">= 1")])
    assert "| x |" in table and "| r | 0.50 | >= 1 | **not met** |" in table
    assert [harness.verdict(v, t) for v, t in [(1.0, ">= 1"), (0.2, "<= 0.1"), (3.0, "report")]
            ] == ["met", "**not met**", ""]


def test_backend_cpu_reads_the_database_s_other_processes(
    pg_admin_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    import psycopg

    monkeypatch.setattr(harness, "ADMIN_DSN", pg_admin_dsn)
    with harness.scratch_database("outboxd_smoke") as dsn, psycopg.connect(
            dsn, autocommit=True) as me, psycopg.connect(dsn, autocommit=True) as other:
        other.execute("SELECT count(*) FROM generate_series(1, 3000000)")  # CPU, then idle
        used = harness.backend_cpu(me)
        assert me.info.backend_pid not in used
        assert used[other.info.backend_pid] > 0


def test_row_costs_runs(pg_admin_dsn: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(harness, "ADMIN_DSN", pg_admin_dsn)
    figures = row_costs.measure(rows=400, rounds=2, fillfactor=50)
    assert figures["indexes"]["every index"] > 0
    assert figures["indexes"]["without every secondary index"] > 0
    assert any(name.startswith("without uq_") for name in figures["indexes"])
    assert figures["split"]["record, split"] > 0
    assert figures["split"]["record, split, log bytes"] > 0
    assert figures["split"]["mark, as the schema is, log bytes"] > 0
    assert 0 <= figures["split"]["share of the split's updates that were HOT"] <= 1


def test_receipt_latency_runs_with_many_waiters(
    pg_admin_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ten agents at once, each staging an operation and waiting for its receipt through
    ``outbox.wait_for`` while an ``outboxd run`` process dispatches them."""
    monkeypatch.setattr(harness, "ADMIN_DSN", pg_admin_dsn)
    with harness.scratch_database("outboxd_smoke") as dsn:
        p50, p99 = latency.receipt_latency(dsn, 30, waiters=10)
    assert 0 < p50 <= p99


def test_phase_timing_runs(pg_admin_dsn: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(harness, "ADMIN_DSN", pg_admin_dsn)
    seconds, timed = phases.measure(300, 100)
    assert seconds > 0
    assert {"claim and mark statement", "dispatching transaction", "record transaction",
            "rows built (OperationRecord.from_raw_values)", "checks of each row (pre_dispatch)"
            } <= set(timed)
    # the claim and mark statement, with its BEGIN (prepared server-side: EXECUTE)
    assert any(label.startswith("SQL BEGIN; EXECUTE outboxd_") for label in timed)


def test_pooler_run_drains_through_pgbouncer(
    pg_admin_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from bench import pooler_run

    monkeypatch.setattr(harness, "ADMIN_DSN", pg_admin_dsn)
    figures = pooler_run.pooled_vs_direct(1, 300, replicas=1)
    assert figures is not None, "pgbouncer is not installed (.ci/run installs it)"
    direct, pooled, ratio = figures
    assert direct.median > 0 and pooled.median > 0
    assert ratio.samples == [pooled.samples[0] / direct.samples[0]]


@pytest.mark.parametrize("overlap", [False, True], ids=["one connection", "overlapped"])
def test_floor_drains_every_row_with_the_daemon_s_records(
    pg_admin_dsn: str, monkeypatch: pytest.MonkeyPatch, overlap: bool
) -> None:
    import psycopg

    from bench import floor

    monkeypatch.setattr(harness, "ADMIN_DSN", pg_admin_dsn)
    with harness.scratch_database("outboxd_smoke") as dsn:
        daemon_runs.prepare(dsn)
        daemon_runs.fill(dsn, 250)
        figures = floor.floor_drain(dsn, 250, 100, overlap=overlap)
        assert figures["rows_per_s"] > 0 and figures["server_cpu_us_per_row"] > 0
        with psycopg.connect(dsn) as conn:
            statuses = conn.execute(
                "SELECT status, count(*), min(attempts), max(attempts), count(receipt)"
                " FROM outbox_operations GROUP BY status").fetchall()
            steps = conn.execute(
                "SELECT from_status, to_status, count(*) FROM outbox_events"
                " GROUP BY 1, 2 ORDER BY 3, 1").fetchall()
            attempts = conn.execute(
                "SELECT result_class, count(DISTINCT operation_id), count(*)"
                " FROM outbox_attempts GROUP BY 1").fetchall()
            tokens = conn.execute(
                "SELECT count(DISTINCT fencing_token) FROM outbox_attempts").fetchone()
    assert statuses == [("applied", 250, 1, 1, 250)]
    assert sorted(steps) == [("claimed", "dispatching", 250), ("dispatching", "applied", 250),
                             ("pending", "claimed", 250)]
    assert attempts == [("applied", 250, 250)]
    assert tokens == (3,)  # one fencing token per claimed batch


def test_wal_counts_a_drain_s_records_in_its_own_database(
    pg_admin_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from bench import wal

    monkeypatch.setattr(harness, "ADMIN_DSN", pg_admin_dsn)
    rate, use = wal.outboxd(300, 100)
    assert rate > 0
    # each operation: three events and an attempt inserted, its row updated twice (the
    # mark and the record); only this database's records count, so the rest of the suite
    # writing beside it adds nothing (the daemon's start-up row in outbox_meta: 1/300)
    inserts = use["Heap/INSERT"].records + use.get("Heap/INSERT+INIT", wal.NONE).records
    updates = use["Heap/UPDATE"].records + use.get("Heap/UPDATE+INIT", wal.NONE).records
    assert inserts == pytest.approx(4, abs=0.02)
    assert updates == pytest.approx(2, abs=0.02)
    assert use["total"].bytes > 0
    _, by_table = wal.outboxd(300, 100, by="relation")
    assert by_table["outbox_events"].records == pytest.approx(3, abs=0.02)
    assert by_table["outbox_attempts"].records == pytest.approx(1, abs=0.02)
    shown = wal.table({"outboxd": by_table}, "relation")
    assert shown.splitlines()[-1].startswith("total") and "outbox_events" in shown


def test_wal_keeps_the_log_it_reads_through_checkpoints(
    pg_admin_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from bench import wal

    monkeypatch.setattr(harness, "ADMIN_DSN", pg_admin_dsn)
    with harness.scratch_database("outboxd_smoke") as dsn, wal.wal_kept(dsn) as conn:
        start = harness.wal_lsn(conn)
        conn.execute("CREATE TABLE t (n int)")
        conn.execute("INSERT INTO t SELECT generate_series(1, 100)")
        for _ in range(3):  # what the rest of a busy server does: segments switched, and
            conn.execute("SELECT pg_switch_wal()")  # a checkpoint that may remove them
            conn.execute("CHECKPOINT")
        use = wal.wal_use(dsn, start, harness.wal_lsn(conn), 100, by="relation")
    assert use["t"].records == pytest.approx(1)  # one heap insert a row
