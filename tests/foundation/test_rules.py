"""Database-side rules (outbox.migrations.rules_0001) hold for every writer, ORM or raw SQL,
on both dialects: immutable identity/payload/key columns, append-only evidence tables, the
payload size limit from ``outbox_meta``, valid JSON.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Engine

from outbox import api, ddl, errors, schema
from outbox.db import mapped_errors
from outbox.ddl import DEFAULT_MAX_PAYLOAD_BYTES
from outbox.migrations import rules_0001

from .sqlcli import count

T = "tenant-a"
ops_t = schema.operations


def url_of(engine: Engine) -> str:
    return engine.url.render_as_string(hide_password=False)


@pytest.fixture
def staged(engine: Engine) -> int:
    with engine.begin() as conn:
        rec = api.enqueue(
            conn,
            tenant_id=T,
            task_id="t1",
            operation_id="op-1",
            provider="tickets",
            payload={"title": "printer on fire"},
        )
    return rec.id


IMMUTABLE: dict[str, Any] = {
    "payload": {"title": "something else"},
    "operation_id": "op-renamed",
    "tenant_id": "tenant-b",
    "task_id": "t9",
    "provider": "mail",
    "idempotency_key": "regenerated-key",
    "payload_digest": "sha256:" + "0" * 64,
    "payload_ref": "s3://bucket/other",
}


RAW_ASSIGNMENTS = [
    'payload = \'{"title": "replaced"}\'',
    "operation_id = 'op-renamed'",
    "tenant_id = 'tenant-b'",
    "idempotency_key = 'fresh-key'",
    "idempotency_key = NULL",
    "payload_digest = 'sha256:00'",
    "payload_digest = NULL",
]


def test_immutable_column_update_is_refused_and_mapped(engine: Engine, staged: int) -> None:
    for column, value in IMMUTABLE.items():
        with pytest.raises(errors.ImmutableField), mapped_errors(), engine.begin() as conn:
            conn.execute(sa.update(ops_t).where(ops_t.c.id == staged).values({column: value}))
    with engine.connect() as conn:
        rec = api.get_operation(conn, tenant_id=T, operation_id="op-1")
    assert rec.payload == {"title": "printer on fire"}
    assert rec.idempotency_key == f"{T}:op-1" and rec.provider == "tickets"


def test_immutable_column_update_is_refused_from_raw_sql(engine: Engine, staged: int) -> None:
    for assignment in RAW_ASSIGNMENTS:
        with (
            pytest.raises(sa.exc.DBAPIError, match="outbox: immutable column"),
            engine.begin() as conn,
        ):
            conn.exec_driver_sql(f"UPDATE outbox_operations SET {assignment} WHERE id = {staged}")


def test_dispatcher_columns_stay_writable(engine: Engine, staged: int) -> None:
    with mapped_errors(), engine.begin() as conn:
        conn.execute(
            sa.update(ops_t)
            .where(ops_t.c.id == staged)
            .values(
                status="blocked",
                status_reason="approval_missing",
                attempts=1,
                state_revision=ops_t.c.state_revision + 1,
                payload=ops_t.c.payload,  # unchanged value: allowed
            )
        )
    assert count(url_of(engine), "SELECT state_revision FROM outbox_operations") == 1


def test_digest_and_key_may_be_filled_once_from_null(engine: Engine) -> None:
    """Admission fills the digest of a plain-SQL row; after that it is fixed."""
    with engine.begin() as conn:
        conn.exec_driver_sql(
            "INSERT INTO outbox_operations (tenant_id, task_id, operation_id, provider, payload) "
            "VALUES ('tenant-a', 't1', 'raw-1', 'tickets', '{\"a\": 1}')"
        )
        conn.exec_driver_sql(
            "UPDATE outbox_operations SET payload_digest = 'sha256:aa' WHERE operation_id = 'raw-1'"
        )
    with pytest.raises(errors.ImmutableField), mapped_errors(), engine.begin() as conn:
        conn.exec_driver_sql(
            "UPDATE outbox_operations SET payload_digest = 'sha256:bb' WHERE operation_id = 'raw-1'"
        )


# --------------------------------------------------------------------- append-only

EVENT = (
    "INSERT INTO outbox_events (tenant_id, operation_id, kind, actor, reason) "
    "VALUES ('tenant-a', 'op-1', 'transition', 'outbox', 'test')"
)
ATTEMPT = (
    "INSERT INTO outbox_attempts (tenant_id, operation_id, attempt, result_class) "
    "VALUES ('tenant-a', 'op-1', 1, 'applied')"
)


@pytest.fixture
def evidence(engine: Engine) -> None:
    with engine.begin() as conn:
        conn.exec_driver_sql(EVENT)
        conn.exec_driver_sql(ATTEMPT)


@pytest.mark.parametrize("table", ["outbox_events", "outbox_attempts"])
def test_append_only_tables_refuse_update_and_delete(
    engine: Engine, evidence: None, table: str
) -> None:
    statements = [
        f"UPDATE {table} SET tenant_id = 'tenant-b'",
        f"DELETE FROM {table}",
        f"DELETE FROM {table} WHERE id = 1",
    ]
    for n, sql in enumerate(statements, start=1):
        with pytest.raises(errors.AppendOnly), mapped_errors(), engine.begin() as conn:
            conn.exec_driver_sql(sql)
        with pytest.raises(sa.exc.DBAPIError, match="append-only"), engine.begin() as conn:
            conn.exec_driver_sql(sql)
        rows = count(url_of(engine), f"SELECT count(*) FROM {table} WHERE tenant_id = 'tenant-a'")
        assert rows == n
        with engine.begin() as conn:  # appending still works
            conn.exec_driver_sql(EVENT if table == "outbox_events" else ATTEMPT)


def test_postgresql_refuses_truncate_of_append_only_tables(engine: Engine, evidence: None) -> None:
    if engine.dialect.name != "postgresql":
        pytest.skip("TRUNCATE is PostgreSQL only (SQLite's DELETE without WHERE is covered)")
    for table in ("outbox_events", "outbox_attempts"):
        with pytest.raises(errors.AppendOnly), mapped_errors(), engine.begin() as conn:
            conn.exec_driver_sql(f"TRUNCATE {table}")
        assert count(url_of(engine), f"SELECT count(*) FROM {table}") == 1


def test_retention_path_may_delete_but_still_not_update(engine: Engine, evidence: None) -> None:
    """Only the purge job's own path deletes evidence (see outbox.migrations.rules_0001)."""
    with engine.begin() as conn:
        if engine.dialect.name == "postgresql":
            conn.exec_driver_sql("SET LOCAL outbox.retention_purge = 'on'")
        else:
            conn.exec_driver_sql(
                "INSERT INTO outbox_meta (tenant_id, name, value) "
                "VALUES ('*', 'retention_purge', '1')"
            )
        conn.exec_driver_sql("DELETE FROM outbox_events")
        if engine.dialect.name == "sqlite":
            conn.exec_driver_sql("DELETE FROM outbox_meta WHERE name = 'retention_purge'")
    assert count(url_of(engine), "SELECT count(*) FROM outbox_events") == 0
    if engine.dialect.name == "postgresql":
        with pytest.raises(errors.AppendOnly), mapped_errors(), engine.begin() as conn:
            conn.exec_driver_sql("SET LOCAL outbox.retention_purge = 'on'")
            conn.exec_driver_sql("UPDATE outbox_attempts SET worker = 'x'")


# --------------------------------------------------------------------- payload size and JSON


def _raw_payload_insert(engine: Engine, operation_id: str, payload_text: str) -> None:
    with mapped_errors(), engine.begin() as conn:
        conn.execute(
            sa.text(
                "INSERT INTO outbox_operations (tenant_id, task_id, operation_id, provider, "
                "payload) VALUES ('tenant-a', 't1', :op, 'tickets', :payload)"
            ),
            {"op": operation_id, "payload": payload_text},
        )


def _payload_of_size(size: int) -> str:
    """JSON text of exactly ``size`` bytes as both dialects measure it."""
    text = json.dumps({"b": ""})
    return json.dumps({"b": "x" * (size - len(text))})


def test_default_limit_is_in_outbox_meta(engine: Engine) -> None:
    with engine.connect() as conn:
        value = conn.execute(
            sa.text(
                "SELECT value FROM outbox_meta WHERE tenant_id = '*' AND name = 'max_payload_bytes'"
            )
        ).scalar_one()
    assert int(value) == DEFAULT_MAX_PAYLOAD_BYTES


def test_database_refuses_a_raw_payload_over_the_limit(engine: Engine) -> None:
    _raw_payload_insert(engine, "at-limit", _payload_of_size(DEFAULT_MAX_PAYLOAD_BYTES))
    with pytest.raises(errors.InvalidPayload, match="max_payload_bytes"):
        _raw_payload_insert(engine, "over", _payload_of_size(DEFAULT_MAX_PAYLOAD_BYTES + 1))
    with pytest.raises(sa.exc.DBAPIError, match="exceeds max_payload_bytes"), engine.begin() as c:
        c.execute(
            sa.text(
                "INSERT INTO outbox_operations (tenant_id, task_id, operation_id, provider, "
                "payload) VALUES ('tenant-a', 't1', 'over', 'tickets', :p)"
            ),
            {"p": _payload_of_size(DEFAULT_MAX_PAYLOAD_BYTES + 10)},
        )
    assert count(url_of(engine), "SELECT count(*) FROM outbox_operations") == 1


def test_lowering_the_limit_in_outbox_meta_takes_effect(engine: Engine) -> None:
    with engine.begin() as conn:
        conn.exec_driver_sql(
            "UPDATE outbox_meta SET value = '200' "
            "WHERE tenant_id = '*' AND name = 'max_payload_bytes'"
        )
    _raw_payload_insert(engine, "small", _payload_of_size(200))
    with pytest.raises(errors.InvalidPayload):
        _raw_payload_insert(engine, "big", _payload_of_size(201))
    # The API's own (default, larger) limit does not matter: the database refuses it too.
    with engine.begin() as conn, pytest.raises(errors.InvalidPayload, match="max_payload_bytes"):
        api.enqueue(
            conn,
            tenant_id=T,
            task_id="t1",
            operation_id="via-api",
            provider="tickets",
            payload={"text": "y" * 400},
        )
    assert count(url_of(engine), "SELECT count(*) FROM outbox_operations") == 1


def test_api_limit_is_checked_before_writing(engine: Engine) -> None:
    with engine.begin() as conn, pytest.raises(errors.InvalidPayload) as caught:
        api.enqueue(
            conn,
            tenant_id=T,
            task_id="t1",
            operation_id="big",
            provider="tickets",
            payload={"text": "z" * 100},
            max_payload_bytes=50,
        )
    assert caught.value.limit == 50  # type: ignore[attr-defined]


def test_invalid_json_text_is_refused(engine: Engine) -> None:
    for text in ["not json", "{'single': 'quotes'}", '{"a": 1', "", '{"a": NaN}']:
        if engine.dialect.name == "sqlite":
            with pytest.raises(errors.InvalidPayload, match="not valid JSON"):
                _raw_payload_insert(engine, "bad-json", text)
        else:  # jsonb's own input check
            with pytest.raises(sa.exc.DataError, match="invalid input syntax for type json"):
                _raw_payload_insert(engine, "bad-json", text)
    assert count(url_of(engine), "SELECT count(*) FROM outbox_operations") == 0


def test_the_live_names_agree_with_the_rules_the_migrations_installed() -> None:
    # the rules are frozen with their revisions; the live code names the same channel and
    # limit, or a dispatcher would LISTEN where no trigger NOTIFYs
    assert ddl.NOTIFY_CHANNEL == rules_0001.NOTIFY_CHANNEL
    assert ddl.DEFAULT_MAX_PAYLOAD_BYTES == rules_0001.DEFAULT_MAX_PAYLOAD_BYTES
    assert any(f"pg_notify('{ddl.NOTIFY_CHANNEL}'" in s for s in rules_0001.postgresql_statements())
