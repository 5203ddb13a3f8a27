"""The throwaway cluster helper: committed data survives a crash (immediate shutdown)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from tests.support.pgcluster import ThrowawayCluster, server_binaries

pytestmark = pytest.mark.postgres


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[ThrowawayCluster]:
    if server_binaries() is None:
        pytest.skip("no PostgreSQL server binaries (initdb, pg_ctl) on this machine")
    c = ThrowawayCluster(tmp_path / "pg")
    yield c
    c.cleanup()


def test_committed_table_survives_immediate_shutdown(
    cluster: ThrowawayCluster, tmp_path: Path
) -> None:
    cluster.start()
    assert cluster.running
    with psycopg.connect(cluster.dsn("postgres"), autocommit=True) as conn:
        conn.execute("CREATE TABLE survivor (id int PRIMARY KEY, note text)")
        conn.execute("INSERT INTO survivor VALUES (1, 'committed before the crash')")
    cluster.immediate_shutdown()
    assert not cluster.running
    with pytest.raises(psycopg.OperationalError):
        psycopg.connect(cluster.dsn("postgres"), connect_timeout=2).close()
    cluster.start()  # crash recovery
    with psycopg.connect(cluster.dsn("postgres")) as conn:
        assert conn.execute("SELECT note FROM survivor").fetchall() == [
            ("committed before the crash",)
        ]
    cluster.restart()
    with psycopg.connect(cluster.url("postgres").replace("+psycopg", "")) as conn:
        assert conn.execute("SELECT count(*) FROM survivor").fetchone() == (1,)
    cluster.cleanup()
    assert not cluster.running
    if cluster.root != tmp_path / "pg":  # a directory of our own (running as root): removed
        assert not cluster.root.exists()
