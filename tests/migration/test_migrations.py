"""Migrations on SQLite and PostgreSQL: head equals the SQLAlchemy metadata, the round trip
down to base and up again works (rules included), upgrade is idempotent, a database from a
newer release is refused, the offline SQL script is complete, and a configured PostgreSQL
schema holds everything.

``compare_metadata`` runs with ``compare_type`` and ``compare_server_default`` on: the
migration is generated from the same metadata and the server defaults compile to the same
text on reflection (``statement_timestamp()`` / ``strftime(...)``, ``'0'``, ``false``), so
no tolerance is needed and none is configured. Autogenerate does not compare CHECK
constraints, partial-index predicates or triggers: those are checked by reflection below.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy.engine import Engine

from outbox import api, db, errors, migrate, schema
from outbox.db import mapped_errors
from tests.conftest import drop_pg_database, new_pg_database
from tests.foundation.sqlcli import libpq_dsn, run_cli

SQLITE_TRIGGERS = {
    "outbox_operations_admit",
    "outbox_operations_default_key",
    "outbox_operations_immutable",
    "outbox_events_append_only_update",
    "outbox_events_append_only_delete",
    "outbox_attempts_append_only_update",
    "outbox_attempts_append_only_delete",
}
PG_TRIGGERS = {
    "outbox_operations_admit",
    "outbox_operations_immutable",
    "outbox_operations_digest_once",
    "outbox_operations_notify",
    "outbox_events_append_only",
    "outbox_events_no_truncate",
    "outbox_attempts_append_only",
    "outbox_attempts_no_truncate",
}
OUTBOX_TABLES = {t.name for t in schema.metadata.sorted_tables}


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def empty_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A database of each dialect that was never migrated."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'empty.db'}"
        return
    admin = request.getfixturevalue("pg_admin_dsn")
    url = new_pg_database(admin, migrated=False)
    yield url
    drop_pg_database(admin, url)


@pytest.fixture
def empty_engine(empty_url: str) -> Iterator[Engine]:
    engine = db.create_engine(empty_url)
    yield engine
    engine.dispose()


def diffs(engine: Engine) -> list[object]:
    with engine.connect() as conn:
        ctx = MigrationContext.configure(
            conn, opts={"compare_type": True, "compare_server_default": True}
        )
        return list(compare_metadata(ctx, schema.metadata))


def triggers(engine: Engine, schema_name: str | None = None) -> set[str]:
    with engine.connect() as conn:
        if engine.dialect.name == "sqlite":
            rows = conn.exec_driver_sql("SELECT name FROM sqlite_master WHERE type = 'trigger'")
        else:
            rows = conn.execute(
                sa.text(
                    "SELECT t.tgname FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid "
                    "JOIN pg_namespace n ON n.oid = c.relnamespace "
                    "WHERE NOT t.tgisinternal AND n.nspname = :s"
                ),
                {"s": schema_name or "public"},
            )
        return {r[0] for r in rows}


def tables(engine: Engine, schema_name: str | None = None) -> set[str]:
    return set(sa.inspect(engine).get_table_names(schema=schema_name))


def expected_triggers(engine: Engine) -> set[str]:
    return SQLITE_TRIGGERS if engine.dialect.name == "sqlite" else PG_TRIGGERS


def assert_rules_work(engine: Engine) -> None:
    """The database-side rules are installed and behave (after any migration path)."""
    with engine.begin() as conn:
        rec = api.enqueue(
            conn,
            tenant_id="t",
            task_id="k",
            operation_id="rule-check",
            provider="p",
            payload={"a": 1},
        )
        conn.exec_driver_sql(
            "INSERT INTO outbox_events (tenant_id, kind, actor) VALUES ('t', 'note', 'test')"
        )
        conn.exec_driver_sql(
            "INSERT INTO outbox_operations (tenant_id, task_id, operation_id, "
            "provider, payload) VALUES ('t', 'k', 'raw', 'p', '{\"b\": 2}')"
        )
    assert rec.idempotency_key == "t:rule-check"
    with engine.connect() as conn:
        raw = conn.exec_driver_sql(
            "SELECT idempotency_key, status FROM outbox_operations WHERE operation_id = 'raw'"
        ).one()
    assert tuple(raw) == ("t:raw", "pending")
    with pytest.raises(errors.ImmutableField), mapped_errors(), engine.begin() as conn:
        conn.exec_driver_sql("UPDATE outbox_operations SET idempotency_key = 'other'")
    with pytest.raises(errors.AppendOnly), mapped_errors(), engine.begin() as conn:
        conn.exec_driver_sql("DELETE FROM outbox_events")
    with engine.begin() as conn:
        conn.exec_driver_sql("UPDATE outbox_meta SET value = '10' WHERE name = 'max_payload_bytes'")
    with pytest.raises(errors.InvalidPayload), mapped_errors(), engine.begin() as conn:
        conn.exec_driver_sql(
            "INSERT INTO outbox_operations (tenant_id, task_id, operation_id, "
            "provider, payload) VALUES ('t', 'k', 'big', 'p', "
            '\'{"long": "enough to pass ten bytes"}\')'
        )


# --------------------------------------------------------------------- head == metadata


def test_upgrade_on_an_empty_database_matches_the_metadata(empty_engine: Engine) -> None:
    assert migrate.current(empty_engine) is None
    reached = migrate.upgrade(empty_engine)
    assert reached == migrate.head() == migrate.current(empty_engine)
    migrate.check_current(empty_engine)
    assert diffs(empty_engine) == []
    assert tables(empty_engine) == OUTBOX_TABLES | {"alembic_version"}
    assert expected_triggers(empty_engine) <= triggers(empty_engine)


def test_reflected_constraints_and_partial_indexes_match(empty_engine: Engine) -> None:
    migrate.upgrade(empty_engine)
    inspector = sa.inspect(empty_engine)
    for table in schema.metadata.sorted_tables:
        want = {c.name for c in table.constraints if isinstance(c, sa.CheckConstraint)}
        got = {c["name"] for c in inspector.get_check_constraints(table.name)}
        assert got == want, table.name
        want_ix = {i.name for i in table.indexes}
        got_ix = {
            i["name"]
            for i in inspector.get_indexes(table.name)
            if not i.get("duplicates_constraint")
        }  # PostgreSQL: unique constraints
        assert got_ix == want_ix, table.name
    if empty_engine.dialect.name == "sqlite":
        with empty_engine.connect() as conn:
            sql = conn.exec_driver_sql(
                "SELECT sql FROM sqlite_master WHERE name = 'ix_outbox_operations_pending_due'"
            ).scalar_one()
    else:
        with empty_engine.connect() as conn:
            sql = conn.exec_driver_sql(
                "SELECT indexdef FROM pg_indexes "
                "WHERE indexname = 'ix_outbox_operations_pending_due'"
            ).scalar_one()
    assert re.search(r"WHERE \(?status = 'pending'", sql), sql


def test_compare_metadata_does_see_a_drifted_schema(empty_engine: Engine) -> None:
    """The comparison above is not vacuous."""
    migrate.upgrade(empty_engine)
    with empty_engine.begin() as conn:
        conn.exec_driver_sql("ALTER TABLE outbox_tasks ADD COLUMN drift TEXT")
        conn.exec_driver_sql("DROP INDEX ix_outbox_events_created")
    kinds = {d[0] for d in diffs(empty_engine) if isinstance(d, tuple)}
    assert {"remove_column", "add_index"} <= kinds


# --------------------------------------------------------------------- round trip


def test_downgrade_to_base_and_upgrade_again(empty_engine: Engine) -> None:
    migrate.upgrade(empty_engine)
    migrate.downgrade(empty_engine, "base")
    assert migrate.current(empty_engine) is None
    assert tables(empty_engine) & OUTBOX_TABLES == set()
    assert triggers(empty_engine) == set()
    if empty_engine.dialect.name == "postgresql":
        with empty_engine.connect() as conn:
            leftovers = conn.execute(
                sa.text(
                    "SELECT proname FROM pg_proc WHERE proname LIKE 'outbox%' UNION ALL "
                    "SELECT relname FROM pg_class WHERE relname LIKE 'outbox%'"
                )
            ).all()
        assert leftovers == []
    with pytest.raises(errors.MigrationError, match="not migrated"):
        migrate.check_current(empty_engine)

    assert migrate.upgrade(empty_engine) == migrate.head()
    assert diffs(empty_engine) == []
    assert expected_triggers(empty_engine) <= triggers(empty_engine)
    assert_rules_work(empty_engine)


def test_upgrade_is_idempotent_and_keeps_data(empty_engine: Engine) -> None:
    migrate.upgrade(empty_engine)
    with empty_engine.begin() as conn:
        api.advance(
            conn,
            "k",
            tenant_id="t",
            expected_revision=0,
            operations=[api.StagedOperation("op", "p", {"a": 1})],
        )
    for _ in range(2):
        assert migrate.upgrade(empty_engine) == migrate.head()
    with empty_engine.connect() as conn:
        task = api.load_task(conn, tenant_id="t", task_id="k")
        meta_rows = conn.exec_driver_sql("SELECT tenant_id, name FROM outbox_meta").all()
        versions = conn.exec_driver_sql("SELECT version_num FROM alembic_version").all()
    assert task.state_revision == 1 and len(task.operations) == 1
    assert len(meta_rows) == len(set(meta_rows))
    assert versions == [(migrate.head(),)]
    assert diffs(empty_engine) == []
    assert_rules_work(empty_engine)


def test_a_database_from_a_newer_release_is_refused(empty_engine: Engine) -> None:
    migrate.upgrade(empty_engine)
    with empty_engine.begin() as conn:
        conn.exec_driver_sql("UPDATE alembic_version SET version_num = '9999_from_the_future'")
    for call in (migrate.upgrade, migrate.check_current):
        with pytest.raises(errors.MigrationError) as caught:
            call(empty_engine)
        err = caught.value
        assert err.database == "9999_from_the_future"  # type: ignore[attr-defined]
        assert err.code == migrate.head()  # type: ignore[attr-defined]
        assert "9999_from_the_future" in str(err) and migrate.head() in str(err)
    with empty_engine.connect() as conn:  # and nothing was touched
        assert conn.exec_driver_sql("SELECT version_num FROM alembic_version").all() == [
            ("9999_from_the_future",)
        ]


def test_check_current_on_head_passes(engine: Engine) -> None:
    migrate.check_current(engine)
    assert migrate.current(engine) == migrate.head()


# --------------------------------------------------------------------- offline SQL


@pytest.mark.parametrize("url", ["sqlite:///outbox.db", "postgresql://u:p@db.example/outbox"])
def test_sql_script_has_the_ddl(url: str) -> None:
    script = migrate.sql_script(url)
    assert "CREATE TABLE outbox_operations" in script
    assert "CREATE TABLE outbox_tasks" in script
    assert "CREATE TRIGGER outbox_operations_immutable" in script
    assert f"'{migrate.head()}'" in script  # alembic_version is stamped


def test_sql_script_applied_with_the_cli_equals_upgrade(empty_url: str) -> None:
    """A DBA runs the script instead of ``outboxd migrate``: same schema, same rules."""
    run_cli(empty_url, migrate.sql_script(empty_url))
    engine = db.create_engine(empty_url)
    try:
        assert migrate.current(engine) == migrate.head()
        assert diffs(engine) == []
        assert expected_triggers(engine) <= triggers(engine)
        assert_rules_work(engine)
    finally:
        engine.dispose()


# --------------------------------------------------------------------- PostgreSQL schema


@pytest.fixture
def pg_empty_url(pg_admin_dsn: str) -> Iterator[str]:
    url = new_pg_database(pg_admin_dsn, migrated=False)
    yield url
    drop_pg_database(pg_admin_dsn, url)


def _schema_objects(url: str, name: str) -> tuple[set[str], set[str]]:
    with psycopg.connect(libpq_dsn(url)) as conn:
        rel = {
            r[0]
            for r in conn.execute(
                "SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
                "WHERE n.nspname = %s AND c.relkind IN ('r', 'S')",
                (name,),
            )
        }
        fns = {
            r[0]
            for r in conn.execute(
                "SELECT p.proname FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace "
                "WHERE n.nspname = %s",
                (name,),
            )
        }
    return rel, fns


@pytest.mark.postgres
def test_configured_schema_holds_everything_and_the_api_works(pg_empty_url: str) -> None:
    engine = db.create_engine(pg_empty_url, schema="obx")
    try:
        assert migrate.upgrade(engine, schema="obx") == migrate.head()
        assert migrate.upgrade(engine, schema="obx") == migrate.head()  # idempotent
        migrate.check_current(engine, schema="obx")
        rel, fns = _schema_objects(pg_empty_url, "obx")
        assert OUTBOX_TABLES | {"alembic_version", schema.FENCING_SEQUENCE} <= rel
        assert {
            "outbox_operations_admit",
            "outbox_operations_immutable",
            "outbox_append_only",
        } <= fns
        public_rel, public_fns = _schema_objects(pg_empty_url, "public")
        assert not {r for r in public_rel if r.startswith(("outbox", "alembic"))}
        assert not {f for f in public_fns if f.startswith("outbox")}
        assert triggers(engine, "obx") >= PG_TRIGGERS

        with engine.begin() as conn:
            task = api.advance(
                conn,
                "k",
                tenant_id="t",
                expected_revision=0,
                phase="one",
                operations=[api.StagedOperation("op-1", "p", {"a": 1})],
            )
        assert task.operations[0].idempotency_key == "t:op-1"
        with engine.begin() as conn:
            api.advance(conn, "k", tenant_id="t", expected_revision=1, phase="two")
            with pytest.raises(errors.RevisionConflict):
                api.advance(conn, "k", tenant_id="t", expected_revision=1, phase="stale")
        with engine.begin() as conn:
            result = api.cancel_task(conn, tenant_id="t", task_id="k", actor="me")
        assert result.cancelled == ("op-1",)
        assert_rules_work(engine)
        with psycopg.connect(libpq_dsn(pg_empty_url)) as conn:
            assert conn.execute("SELECT count(*) FROM obx.outbox_operations").fetchone() == (3,)
    finally:
        engine.dispose()


@pytest.mark.postgres
def test_configured_schema_round_trip(pg_empty_url: str) -> None:
    engine = db.create_engine(pg_empty_url, schema="obx")
    try:
        migrate.upgrade(engine, schema="obx")
        migrate.downgrade(engine, "base", schema="obx")
        assert migrate.current(engine, schema="obx") is None
        rel, fns = _schema_objects(pg_empty_url, "obx")
        assert rel <= {"alembic_version"} and not fns
        migrate.upgrade(engine, schema="obx")
        assert_rules_work(engine)
    finally:
        engine.dispose()


@pytest.mark.postgres
def test_offline_script_for_a_configured_schema(pg_empty_url: str) -> None:
    script = migrate.sql_script(pg_empty_url, schema="obx")
    run_cli(pg_empty_url, script)
    rel, _ = _schema_objects(pg_empty_url, "obx")
    assert OUTBOX_TABLES | {"alembic_version"} <= rel
    engine = db.create_engine(pg_empty_url, schema="obx")
    try:
        migrate.check_current(engine, schema="obx")
        assert_rules_work(engine)
    finally:
        engine.dispose()


def test_sql_script_needs_no_database() -> None:
    """``outboxd migrate --sql`` renders without connecting (no server at that address)."""
    script = migrate.sql_script("postgresql://nobody@192.0.2.1:1/none")
    assert "CREATE TABLE outbox_operations" in script


def test_migration_files_are_the_known_revisions() -> None:
    versions = Path(migrate.MIGRATIONS) / "versions"
    files = sorted(p.name for p in versions.glob("*.py") if not p.name.startswith("_"))
    assert len(files) == len(migrate.known_revisions())
    assert migrate.head() in migrate.known_revisions()
