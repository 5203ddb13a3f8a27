"""Statements run on the driver's cursor (:mod:`dispatcher.store.direct`) behave as
``Connection.execute`` would: the same rows, the caller's transaction, a statement's error
as SQLAlchemy's class of it, a lost connection as an invalidated one (an outage).
Real PostgreSQL."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Engine

from dispatcher.store import direct
from outbox import db, migrate, schema
from tests.dispatcher import stage

ops = schema.operations


@pytest.fixture
def pg(pg_url: str) -> Iterator[Engine]:
    eng = db.create_engine(pg_url)
    yield eng
    eng.dispose()


def test_the_same_rows_as_execute_with_fixed_and_bound_values(pg: Engine) -> None:
    statement = sa.select(
        sa.bindparam("n", type_=sa.Integer()) + 1, sa.literal("fixed"), sa.literal(7)
    )
    with pg.connect() as conn:
        assert direct.fetch_all(conn, statement, {"n": 41}) == [(42, "fixed", 7)]
        assert direct.fetch_all(conn, statement, {"n": 1}) == [tuple(
            conn.execute(statement, {"n": 1}).one())]


def test_runs_in_the_callers_transaction(pg: Engine) -> None:
    insert = (
        sa.insert(schema.meta)
        .values(name=sa.bindparam("k", type_=sa.Text()), value=sa.literal("v"))
        .returning(schema.meta.c.name)
    )
    with pg.connect() as conn:
        with conn.begin() as tx:
            assert direct.fetch_all(conn, insert, {"k": "direct:rolled-back"}) == [
                ("direct:rolled-back",)]
            tx.rollback()
        with conn.begin():
            direct.fetch_all(conn, insert, {"k": "direct:kept"})
        keys = set(conn.execute(sa.select(schema.meta.c.name)).scalars())
    assert "direct:kept" in keys and "direct:rolled-back" not in keys


def test_tables_in_the_engines_schema(pg: Engine, pg_url: str) -> None:
    stage(pg, 2)  # in the default schema; none in "obx"
    in_schema = db.create_engine(pg_url, schema="obx")
    try:
        migrate.upgrade(in_schema, schema="obx")
        count = sa.select(sa.func.count()).select_from(ops)
        with in_schema.connect() as conn:
            assert direct.fetch_all(conn, count, {}) == [(0,)]
        with pg.connect() as conn:
            assert direct.fetch_all(conn, count, {}) == [(2,)]
    finally:
        in_schema.dispose()


def test_a_statement_error_is_sqlalchemys_class_and_no_outage(pg: Engine) -> None:
    statement = sa.select(sa.cast(sa.bindparam("v", type_=sa.Text()), sa.Integer()))
    with pg.connect() as conn, pytest.raises(sa.exc.DataError) as caught:
        direct.fetch_all(conn, statement, {"v": "not a number"})
    assert not caught.value.connection_invalidated
    assert not db.is_outage(caught.value)
    assert "parameters hidden" in str(caught.value)  # a batch may carry receipts


def test_a_lost_connection_is_invalidated_and_an_outage(pg: Engine) -> None:
    statement = sa.select(sa.bindparam("n", type_=sa.Integer()))
    with pg.connect() as conn:
        pid = conn.execute(sa.text("SELECT pg_backend_pid()")).scalar_one()
        with pg.connect() as other:
            other.execute(sa.text("SELECT pg_terminate_backend(:p)"), {"p": pid})
        with pytest.raises(sa.exc.OperationalError) as caught:
            direct.fetch_all(conn, statement, {"n": 1})
        assert caught.value.connection_invalidated
        assert db.is_outage(caught.value)
        assert conn.invalidated
    with pg.connect() as conn:  # the pool hands out a working connection again
        assert direct.fetch_all(conn, statement, {"n": 3}) == [(3,)]


def test_a_statement_that_needs_bind_processing_is_refused(pg: Engine) -> None:
    statement = sa.select(ops.c.id).where(ops.c.id.in_(sa.bindparam("ids", expanding=True)))
    with pg.connect() as conn, pytest.raises(TypeError, match="plain values"):
        direct.fetch_all(conn, statement, {"ids": [1, 2]})


def test_each_statement_keeps_its_cursor_and_an_error_drops_it(pg: Engine) -> None:
    plus = sa.select(sa.bindparam("n", type_=sa.Integer()) + 1)
    text = sa.select(sa.cast(sa.bindparam("v", type_=sa.Text()), sa.Integer()))
    # autocommit, as the daemon's kept connections: a failed statement ends nothing else
    with pg.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        kept = conn.connection.info.setdefault(direct.KEPT_CURSORS, {})
        for n in range(3):  # alternating statements: each reads its own rows
            assert direct.fetch_all(conn, plus, {"n": n}) == [(n + 1,)]
            assert direct.fetch_all(conn, text, {"v": str(n)}) == [(n,)]
        assert len(kept) == 2
        first = dict(kept)
        assert direct.fetch_all(conn, plus, {"n": 9}) == [(10,)]
        assert kept == first  # the same cursors, not new ones
        with pytest.raises(sa.exc.DataError):
            direct.fetch_all(conn, text, {"v": "not a number"})
        assert set(kept.values()) == {first[next(k for k in first if "+" in k)]}
        assert direct.fetch_all(conn, text, {"v": "5"}) == [(5,)]  # a fresh cursor


def test_a_statement_without_rows_returns_none(pg: Engine) -> None:
    update = (sa.update(schema.meta).where(schema.meta.c.name == sa.bindparam("k", type_=sa.Text()))
              .values(value=sa.literal("v")))
    with pg.connect() as conn, conn.begin():
        assert direct.fetch_all(conn, update, {"k": "direct:nothing"}) == []
        assert direct.fetch_all(conn, update, {"k": "direct:nothing"}) == []


def test_placeholders_are_numbered_once_a_name_however_often_it_is_used(pg: Engine) -> None:
    """psycopg's statements run with PostgreSQL's own ``$n`` placeholders, converted once
    (psycopg re-reads a ``%(name)s`` text longer than 4 KiB on every execution): a name
    used twice binds one value, a literal ``%`` survives, and a text over 4 KiB runs."""
    assert direct.numbered("SELECT %(a)s, %(b)s, %(a)s || '%%'") == (
        "SELECT $1, $2, $1 || '%'", ("a", "b"))
    n = sa.bindparam("n", type_=sa.Integer())
    long = sa.select(n + 1, n * 2, sa.literal_column("'" + "x" * 5000 + "'").label("pad"),
                     sa.literal_column("'50%'").label("pct"))
    with pg.connect() as conn:
        assert direct.prepared(long, conn.dialect).numbered
        assert direct.fetch_all(conn, long, {"n": 20}) == [(21, 40, "x" * 5000, "50%")]
        assert direct.fetch_all(conn, long, {"n": 1})[0][:2] == (2, 2)


def _preparing(pg_url: str) -> Engine:
    """An engine whose connections prepare statements server-side, as the daemon's do
    where no pooler sits between it and PostgreSQL."""
    eng = db.create_engine(pg_url, isolation_level="AUTOCOMMIT")

    @sa.event.listens_for(eng, "connect")
    def prepare(dbapi_connection: object, _record: object) -> None:
        dbapi_connection.prepare_threshold = 5  # type: ignore[attr-defined]

    return eng


def _statement() -> sa.Select[tuple[str, float, str]]:
    return sa.select(
        sa.bindparam("actor", type_=sa.Text()),
        sa.bindparam("lease", type_=sa.Float()) * 1000,  # a float the text cannot tell
        sa.literal("fixed"),
    )


def _server_prepared(conn: sa.Connection) -> list[str]:
    return list(conn.exec_driver_sql(
        "SELECT name FROM pg_prepared_statements WHERE name LIKE 'outboxd%%'").scalars())


def test_begin_and_the_statement_take_one_round_trip_where_statements_are_prepared(
    pg_url: str,
) -> None:
    eng = _preparing(pg_url)
    try:
        with eng.connect() as conn:
            for actor in ("w1", "it's w2"):  # quoted as psycopg quotes a bound value
                rows = direct.begin_and_fetch(conn, _statement(), {"actor": actor,
                                                                  "lease": 2.5})
                assert rows == [(actor, 2500.0, "fixed")]
                raw = conn.connection.dbapi_connection
                assert raw is not None and raw.info.transaction_status.name == "INTRANS"
                direct.run(conn, "COMMIT")
            assert _server_prepared(conn) == ["outboxd_1"]  # prepared once
    finally:
        eng.dispose()


def test_begin_and_the_statement_keep_one_cursor_from_batch_to_batch(pg_url: str) -> None:
    """A claim's text is the same on every batch: its cursor is kept (with the loaders
    psycopg set up for its result's columns), as :func:`direct.fetch_all` keeps its own."""
    eng = _preparing(pg_url)
    try:
        with eng.connect() as conn:
            kept = conn.connection.info.setdefault(direct.KEPT_CURSORS, {})
            cursors = set()
            for _ in range(3):
                rows = direct.begin_and_fetch(conn, _statement(), {"actor": "w", "lease": 1.0})
                assert rows == [("w", 1000.0, "fixed")]
                direct.run(conn, "COMMIT")
                cursors |= {id(c) for sql, c in kept.items() if sql.startswith("BEGIN; ")}
            assert len(cursors) == 1
    finally:
        eng.dispose()


def test_elsewhere_the_statement_goes_with_its_values_in_place(pg: Engine) -> None:
    """A connection that prepares nothing (a transaction pooler): ``BEGIN`` and the
    statement, its values quoted in place, as one simple query — a ``%`` of the text, a
    placeholder used twice and a quote in a value included."""
    statement = sa.select(
        sa.bindparam("actor", type_=sa.Text()), sa.literal_column("'50%'"),
        sa.bindparam("actor", type_=sa.Text()) + "!", sa.bindparam("lease", type_=sa.Float()))
    with pg.connect() as conn:
        conn.execution_options(isolation_level="AUTOCOMMIT")
        rows = direct.begin_and_fetch(conn, statement, {"actor": "it's", "lease": 1.5})
        assert rows == [("it's", "50%", "it's!", 1.5)]
        raw = conn.connection.dbapi_connection
        assert raw is not None and raw.info.transaction_status.name == "INTRANS"
        direct.run(conn, "ROLLBACK")
        assert _server_prepared(conn) == []


def test_an_error_leaves_the_transaction_to_roll_back_and_the_next_call_works(
    pg_url: str,
) -> None:
    eng = _preparing(pg_url)
    failing = sa.select(sa.cast(sa.bindparam("n", type_=sa.Text()), sa.Integer()))
    try:
        with eng.connect() as conn:
            with pytest.raises(sa.exc.DataError):
                direct.begin_and_fetch(conn, failing, {"n": "not a number"})
            direct.run(conn, "ROLLBACK")
            assert direct.begin_and_fetch(conn, failing, {"n": "7"}) == [(7,)]
            direct.run(conn, "COMMIT")
    finally:
        eng.dispose()


def test_past_the_prepared_statements_cap_the_values_go_in_place(
    pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(direct, "MAX_SERVER_PREPARED", 1)
    eng = _preparing(pg_url)
    try:
        with eng.connect() as conn:
            for limit in (1, 2, 1):
                statement = sa.select(sa.literal_column(str(limit)),
                                      sa.bindparam("actor", type_=sa.Text()))
                assert direct.begin_and_fetch(conn, statement, {"actor": "w"}) == [
                    (limit, "w")]
                direct.run(conn, "COMMIT")
            assert _server_prepared(conn) == ["outboxd_1"]
    finally:
        eng.dispose()


def test_a_statement_deallocated_since_is_prepared_again(pg_url: str) -> None:
    """psycopg deallocates every prepared statement of a connection after a ``ROLLBACK``
    once it has prepared one of its own (or after ``DEALLOCATE ALL``): the next call finds
    its statement gone, rolls its ``BEGIN`` back and prepares it again."""
    eng = _preparing(pg_url)
    try:
        with eng.connect() as conn:
            assert direct.begin_and_fetch(conn, _statement(), {"actor": "w", "lease": 1.0})
            direct.run(conn, "COMMIT")
            direct.run(conn, "DEALLOCATE ALL")
            rows = direct.begin_and_fetch(conn, _statement(), {"actor": "w", "lease": 1.0})
            assert rows == [("w", 1000.0, "fixed")]
            raw = conn.connection.dbapi_connection
            assert raw is not None and raw.info.transaction_status.name == "INTRANS"
            direct.run(conn, "COMMIT")
            assert _server_prepared(conn) == ["outboxd_2"]
    finally:
        eng.dispose()
