"""Every multi-host spelling of a PostgreSQL URL that libpq or SQLAlchemy accepts works for
the claims and for the LISTEN connection alike: the first host listed is down, the second
is the test server. A URL outboxd cannot read is a one-line error naming what to write."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import sqlalchemy as sa

from outbox import db
from tests.dispatcher import config, engine_for, stage
from tests.support.daemon import REPO_ROOT, DaemonProcess, settled, wait_until
from tests.support.pgcluster import free_port
from tests.support.sim import SimProcess

N = 20


def _spellings(pg_url: str, down: int) -> dict[str, str]:
    u = sa.engine.make_url(pg_url)
    user, host, port, name = u.username, u.host, u.port or 5432, u.database
    rw = "target_session_attrs=read-write"
    return {
        "libpq-uri": f"postgresql://{user}@{host}:{down},{host}:{port}/{name}?{rw}",
        "host-and-port-lists": f"postgresql://{user}@/{name}?host={host},{host}"
                               f"&port={down},{port}&{rw}",
        "repeated-host": f"postgresql://{user}@/{name}?host={host}:{down}"
                         f"&host={host}:{port}&{rw}",
        "host-list-with-ports": f"postgresql://{user}@/{name}?host={host}:{down},"
                                f"{host}:{port}&{rw}",
    }


@pytest.mark.slow
@pytest.mark.postgres
@pytest.mark.parametrize("spelling", ["libpq-uri", "host-and-port-lists", "repeated-host",
                                      "host-list-with-ports"])
def test_each_multi_host_spelling_claims_and_listens(
    spelling: str, pg_url: str, tmp_path: Path
) -> None:
    url = _spellings(pg_url, free_port())[spelling]
    engine = engine_for(pg_url)
    try:
        with SimProcess(tmp_path) as sim, DaemonProcess(config(tmp_path, url, sim)) as d:
            def listening() -> bool:
                with engine.connect() as conn:
                    return bool(conn.execute(sa.text(
                        "SELECT count(*) FROM pg_stat_activity WHERE datname ="
                        " current_database() AND query LIKE 'LISTEN %'")).scalar_one())

            wait_until(listening, timeout=30, message="the LISTEN connection")
            stage(engine, N)
            wait_until(lambda: settled(engine, N), timeout=30)
            assert "Traceback" not in d.log_text()
    finally:
        engine.dispose()


def test_a_url_outboxd_cannot_read_is_one_line_naming_what_to_write(tmp_path: Path) -> None:
    path = tmp_path / "bad.toml"
    path.write_text('[database]\nurl = "postgresql://u:s3cret@h:notaport/db"\n'
                    '[providers.p]\nkind = "null"\n')
    done = subprocess.run([sys.executable, "-m", "dispatcher.cli", "status", "--config",
                           str(path)], cwd=REPO_ROOT, capture_output=True, text=True,
                          timeout=60, check=False)
    assert done.returncode == 2, done.stderr
    assert done.stderr.count("\n") == 1 and "s3cret" not in done.stderr
    assert done.stderr.startswith("outboxd: configuration error: database.url: cannot be read")
    assert "HOST1:PORT1,HOST2:PORT2" in done.stderr


@pytest.mark.parametrize(("given", "read"), [
    ("postgresql://u@a:1,b:2/d", "postgresql+psycopg://u@/d?host=a,b&port=1,2"),
    ("postgresql://u@/d?host=a:1,b:2&sslmode=require",
     "postgresql+psycopg://u@/d?sslmode=require&host=a,b&port=1,2"),
    ("postgresql://u@[::1]:1,b/d", "postgresql+psycopg://u@/d?host=::1,b&port=1,5432"),
    ("postgresql://u@/d?host=a,b&port=1,2", "postgresql+psycopg://u@/d?host=a,b&port=1,2"),
    ("postgresql://u@h:5/d?host=/run/pg", "postgresql+psycopg://u@h:5/d?host=/run/pg"),
])
def test_host_lists_are_spelled_one_way(given: str, read: str) -> None:
    assert db.normalise_url(given) == read
