"""Shared fixtures: real SQLite files and the real PostgreSQL, a fresh database per test.

PostgreSQL: ``OUTBOXD_TEST_PG_URL`` (default: postgres on 127.0.0.1:5432). A migrated
template database is built once per session and cloned per test (``CREATE DATABASE ...
TEMPLATE``). When PostgreSQL is unreachable the tests start a throwaway cluster if server
binaries exist, else skip with a loud reason — and under ``CI=true`` a skip is a failure.
"""

from __future__ import annotations

import os
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Engine

from outbox import db, migrate
from tests.support.agents import FLAVOURS, Agent, agent_for

for _name in [n for n in os.environ if n.startswith("OUTBOXD_") and n != "OUTBOXD_TEST_PG_URL"]:
    del os.environ[_name]

DEFAULT_PG = "postgresql://postgres@127.0.0.1:5432/postgres"
TEMPLATE = f"outboxd_tpl_{os.getpid()}"


_current: list[pytest.Item] = []
DAEMON_VERBS = ("run", "demo")


def _daemon_guard(event: str, args: tuple[object, ...]) -> None:
    """A test that starts an ``outboxd run`` (or ``demo``) process must be marked ``slow``:
    ``make check`` leaves slow tests out and promises that what it runs starts no daemon.
    (An audit hook sees every process any helper starts; it raises before the process
    exists, so an unmarked test fails saying what to fix.)"""
    if event != "subprocess.Popen" or not _current:
        return
    argv = [str(a) for a in args[1]] if isinstance(args[1], list | tuple) else [str(args[1])]
    if "dispatcher.cli" in argv[:-1]:
        verb = argv[argv.index("dispatcher.cli") + 1]
    elif len(argv) > 1 and Path(argv[0]).name == "outboxd":
        verb = argv[1]
    else:
        return
    item = _current[-1]
    if verb in DAEMON_VERBS and item.get_closest_marker("slow") is None:
        raise RuntimeError(f"{item.nodeid} starts `outboxd {verb}`: mark it "
                           "@pytest.mark.slow (make check runs only tests that start no daemon)")


sys.addaudithook(_daemon_guard)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> object:
    _current.append(item)
    try:
        return (yield)
    finally:
        _current.pop()


def _admin_dsn(url: str) -> str:
    return url.replace("postgresql+psycopg://", "postgresql://")


def _reachable(dsn: str) -> bool:
    try:
        with psycopg.connect(dsn, connect_timeout=3) as conn:
            conn.execute("SELECT 1")
        return True
    except psycopg.OperationalError:
        return False


def _unavailable(reason: str) -> None:
    message = f"PostgreSQL tests NOT RUN: {reason}"
    if os.environ.get("CI") == "true":
        pytest.fail(message + " (CI=true: a skipped PostgreSQL test is a failure)")
    pytest.skip(message)


@pytest.fixture(scope="session")
def pg_admin_dsn(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    dsn = _admin_dsn(os.environ.get("OUTBOXD_TEST_PG_URL", DEFAULT_PG))
    cluster = None
    if not _reachable(dsn):
        from tests.support.pgcluster import ThrowawayCluster, server_binaries

        if server_binaries() is None:
            _unavailable(f"{dsn} unreachable and no PostgreSQL server binaries to start one")
        cluster = ThrowawayCluster(tmp_path_factory.mktemp("pgcluster"))
        cluster.start()
        dsn = cluster.dsn("postgres")
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{TEMPLATE}"')
        conn.execute(f'CREATE DATABASE "{TEMPLATE}"')
    engine = db.create_engine(dsn.rsplit("/", 1)[0] + f"/{TEMPLATE}")
    migrate.upgrade(engine)
    engine.dispose()
    yield dsn
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{TEMPLATE}" WITH (FORCE)')
    if cluster is not None:
        cluster.stop()


def new_pg_database(admin_dsn: str, *, migrated: bool = True) -> str:
    """Create a fresh database (a clone of the migrated template) and return its URL."""
    name = f"outboxd_t_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        if migrated:
            conn.execute(f'CREATE DATABASE "{name}" TEMPLATE "{TEMPLATE}"')
        else:
            conn.execute(f'CREATE DATABASE "{name}"')
    return "postgresql+psycopg://" + admin_dsn.split("://", 1)[1].rsplit("/", 1)[0] + "/" + name


def drop_pg_database(admin_dsn: str, url: str) -> None:
    name = url.rsplit("/", 1)[1]
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def _moves_allowed(url: str) -> None:
    """Every status move a test left in ``outbox_events`` is one the transition table
    allows (checked before its database goes)."""
    from tests.support.moves_seen import forbidden_moves

    bad = forbidden_moves(url)
    if bad:
        pytest.fail(f"outbox_events holds moves the transition table forbids: {bad}")


@pytest.fixture
def pg_url(pg_admin_dsn: str) -> Iterator[str]:
    url = new_pg_database(pg_admin_dsn)
    yield url
    try:
        _moves_allowed(url)
    finally:
        drop_pg_database(pg_admin_dsn, url)


@pytest.fixture
def sqlite_url(tmp_path: Path) -> Iterator[str]:
    url = f"sqlite:///{tmp_path / 'outbox.db'}"
    engine = db.create_engine(url)
    migrate.upgrade(engine)
    engine.dispose()
    yield url
    _moves_allowed(url)


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def db_url(request: pytest.FixtureRequest) -> str:
    """A migrated database of each dialect."""
    name = "sqlite_url" if request.param == "sqlite" else "pg_url"
    value = request.getfixturevalue(name)
    assert isinstance(value, str)
    return value


@pytest.fixture
def engine(db_url: str) -> Iterator[Engine]:
    eng = db.create_engine(db_url)
    yield eng
    eng.dispose()


@pytest.fixture(params=FLAVOURS)
def agent(request: pytest.FixtureRequest, engine: Engine) -> Iterator[Agent]:
    """The agent API on ``engine``'s database, sync (``outbox.api``) and async
    (``outbox.aio``): a test taking it is the contract of both."""
    made = agent_for(request.param, engine)
    yield made
    made.close()


def count(engine: Engine, sql: str, **params: object) -> int:
    with engine.connect() as conn:
        return int(conn.execute(sa.text(sql), params).scalar_one())
