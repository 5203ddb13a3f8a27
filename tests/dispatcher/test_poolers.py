"""Behind a real PgBouncer (Debian's package, a process of this test's own): two replicas
drain every row exactly once in transaction and in session pooling, and no statement runs
under another client's prepared-statement name (psycopg prepares nothing under a
transaction pooler)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Engine

from outbox import db, migrate
from tests.dispatcher import assert_once_each, config, stage
from tests.support.daemon import DaemonProcess, settled, wait_until
from tests.support.pgbouncer import PgBouncer, binary
from tests.support.sim import SimProcess

N = 1000
# what a pooler breaks when the driver assumes one server connection per client
STATEMENT_ERRORS = ("prepared statement", "InvalidSqlStatementName",
                    "DuplicatePreparedStatement", "bind message supplies",
                    "database unavailable", "does not exist")

pytestmark = [pytest.mark.slow, pytest.mark.postgres]


@pytest.fixture
def bouncer_binary() -> str:
    found = binary()
    if found is None:
        pytest.fail("pgbouncer is not installed: .ci/run installs Debian's package pgbouncer")
    return found


def _listening(engine: Engine) -> int:
    """Backends of this database waiting in LISTEN (seen on the server, past any pooler)."""
    with engine.connect() as conn:
        return int(conn.execute(sa.text(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
            " AND query LIKE 'LISTEN %'")).scalar_one())


def _drain_through(tmp_path: Path, pg_url: str, pg_admin_dsn: str, mode: str,
                   database: dict[str, Any]) -> tuple[list[DaemonProcess], int]:
    schema = database.get("schema")
    engine = db.create_engine(pg_url, schema=schema)
    if schema:  # the tables in a schema of their own, found per transaction
        migrate.upgrade(engine, schema=schema)
    ids = stage(engine, N, per_task=100)
    with PgBouncer(tmp_path, upstream=pg_admin_dsn, mode=mode,
                   reset_always=bool(schema)) as bouncer, \
            SimProcess(tmp_path) as sim:
        url = bouncer.url_for(pg_url)
        replicas = [DaemonProcess(config(tmp_path, url, sim, lease_seconds=5.0,
                                         worker_id=f"r{i}", name=f"r{i}.toml",
                                         database=database,
                                         dispatcher={"batch_size": 50, "concurrency": 16}))
                    for i in range(2)]
        with replicas[0], replicas[1]:
            wait_until(lambda: settled(engine, N), timeout=120)
            listening = _listening(engine)
        assert_once_each(sim, ids)
    engine.dispose()
    return replicas, listening


@pytest.mark.parametrize("listen", ["no-listen-url", "listen-url", "schema"])
def test_transaction_pooling_applies_every_row_once_with_no_statement_errors(
    bouncer_binary: str, tmp_path: Path, pg_url: str, pg_admin_dsn: str, listen: str
) -> None:
    database: dict[str, Any] = {"pooler": "transaction"}
    if listen == "listen-url":
        database["listen_url"] = pg_url  # direct: LISTEN needs a connection of its own
    if listen == "schema":  # search_path is session state a transaction pooler loses
        database["schema"] = "obx"
    replicas, listening = _drain_through(tmp_path, pg_url, pg_admin_dsn, "transaction",
                                         database)
    for r in replicas:
        log = r.log_text()
        assert not [e for e in STATEMENT_ERRORS if e in log], log[-3000:]
        # never silently: without a listen_url the replica says it polls
        assert ("LISTEN is off" in log) == (listen != "listen-url"), log[-3000:]
    assert listening == (2 if listen == "listen-url" else 0)


def test_session_pooling_applies_every_row_once(
    bouncer_binary: str, tmp_path: Path, pg_url: str, pg_admin_dsn: str
) -> None:
    replicas, listening = _drain_through(tmp_path, pg_url, pg_admin_dsn, "session",
                                         {"pooler": "session"})
    for r in replicas:
        log = r.log_text()
        assert not [e for e in STATEMENT_ERRORS if e in log], log[-3000:]
    assert listening == 2  # through the session pooler: a server connection each


def test_a_pooler_the_configuration_does_not_mention_is_said(
    bouncer_binary: str, tmp_path: Path, pg_url: str, pg_admin_dsn: str
) -> None:
    from dispatcher.config import load_config
    from dispatcher.daemon import Daemon
    from tests.support.daemon import write_config

    with PgBouncer(tmp_path, upstream=pg_admin_dsn, mode="transaction") as bouncer:
        for url, said in ((bouncer.url_for(pg_url), True), (pg_url, False)):
            path = write_config(tmp_path, url, {"sink": {"kind": "null"}})
            daemon = Daemon(load_config(path, env={}))
            try:
                daemon._check_for_a_pooler()
                assert bool(daemon.health.warnings) == said, daemon.health.warnings
                assert not said or 'set database.pooler = "transaction"' in \
                    daemon.health.warnings[0]
            finally:
                daemon.worker.close()
                daemon.engine.dispose()


def _threshold(daemon: Any) -> int | None:
    with daemon.engine.connect() as conn:
        value = conn.connection.dbapi_connection.prepare_threshold
    return None if value is None else int(value)


def test_statements_are_prepared_only_where_no_pooler_can_hand_them_on(
    bouncer_binary: str, tmp_path: Path, pg_url: str, pg_admin_dsn: str
) -> None:
    """Direct: prepared (psycopg's threshold). Through a pooler the configuration does not
    mention, through a declared transaction pooler, or with the user's own
    ``prepare_threshold``: as the engine was made (nothing prepared unless the user says).
    A declared session pooler keeps a server connection per client: prepared."""
    from dispatcher.config import load_config
    from dispatcher.daemon import PREPARE_THRESHOLD, Daemon
    from tests.support.daemon import write_config

    with PgBouncer(tmp_path, upstream=pg_admin_dsn, mode="transaction") as tx, \
            PgBouncer(tmp_path, upstream=pg_admin_dsn, mode="session") as session:
        cases = [
            (pg_url, {}, PREPARE_THRESHOLD),
            (pg_url, {"options": {"prepare_threshold": "none"}}, None),
            (pg_url, {"options": {"prepare_threshold": "0"}}, 0),
            (tx.url_for(pg_url), {}, None),
            (tx.url_for(pg_url), {"pooler": "transaction"}, None),
            (session.url_for(pg_url), {"pooler": "session"}, PREPARE_THRESHOLD),
        ]
        for url, database, expected in cases:
            path = write_config(tmp_path, url, {"sink": {"kind": "null"}}, database=database)
            daemon = Daemon(load_config(path, env={}))
            try:
                daemon._choose_preparation()
                assert _threshold(daemon) == expected, (url, database)
            finally:
                daemon.worker.close()
                daemon.engine.dispose()
