"""PostgreSQL crash-stopped (immediate shutdown) and restarted in the middle of a run, on
a throwaway cluster of the test's own (never the machine's shared server): the daemon
rides it out and the drain completes with nothing lost and nothing doubled."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import psycopg
import pytest

from tests.dispatcher import assert_once_each, config, engine_at, stage
from tests.support.daemon import REPO_ROOT, DaemonProcess, status_counts, wait_until
from tests.support.pgcluster import ThrowawayCluster, server_binaries
from tests.support.sim import SimProcess

N = 120


@pytest.mark.slow
@pytest.mark.postgres
def test_drain_survives_a_postgres_crash_and_restart(tmp_path: Path) -> None:
    if server_binaries() is None:
        pytest.skip("no PostgreSQL server binaries to run a throwaway cluster")
    cluster = ThrowawayCluster(tmp_path / "pg")
    try:
        cluster.start()
        with psycopg.connect(cluster.dsn(), autocommit=True) as conn:
            conn.execute("CREATE DATABASE outbox")
        url = cluster.url("outbox")
        with SimProcess(tmp_path, "--p-slow", "1.0", "--slow-seconds", "0.05") as sim:
            cfg = config(
                tmp_path, url, sim, lease_seconds=2,
                dispatcher={"concurrency": 4, "batch_size": 8},
            )  # fmt: skip
            migrated = subprocess.run(
                [sys.executable, "-m", "dispatcher.cli", "migrate", "--config", str(cfg)],
                cwd=REPO_ROOT, capture_output=True, text=True, timeout=120, check=False,
            )  # fmt: skip
            assert migrated.returncode == 0, migrated.stderr
            with engine_at(url) as engine:
                ids = stage(engine, N)
                with DaemonProcess(cfg) as d:
                    wait_until(
                        lambda: status_counts(engine).get("applied", 0) >= N // 5,
                        timeout=60,
                        message="a fifth applied",
                    )
                    engine.dispose()  # the test's own connections die with the server
                    cluster.immediate_shutdown()
                    assert d.alive()
                    cluster.start()
                    wait_until(
                        lambda: status_counts(engine) == {"applied": N},
                        timeout=90,
                        interval=0.2,
                        message="drain completed after the restart",
                    )
                    assert d.alive()
                assert_once_each(sim, ids)
                assert sim.stats()["requests"] >= N
    finally:
        cluster.cleanup()
