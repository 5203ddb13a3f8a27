"""The plain-SQL path (docs/plain-sql.md), run through the real ``psql`` and ``sqlite3``
clients: an agent that is not written in Python gives only the required columns and gets
a valid row; it advances its checkpoint with compare-and-set and stages operations in the
same transaction; the dispatcher's admission turns malformed rows into reasons.
"""

from __future__ import annotations

import re
import sqlite3
from datetime import UTC, datetime, timedelta
from pathlib import Path

import psycopg
import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Engine

from outbox import admission, api
from outbox.digest import default_idempotency_key, payload_digest
from outbox.states import OperationStatus

from .sqlcli import CliError, dialect_of, libpq_dsn, peek, run_cli, sqlite_path

SQLITE_TS = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{6}$")
NOW = {
    "sqlite": "strftime('%Y-%m-%d %H:%M:%f000', 'now')",
    "postgresql": "now()",
}

OP_INSERT = (
    "INSERT INTO outbox_operations (tenant_id, task_id, operation_id, provider, payload) "
    "VALUES ('acme', 'case-8472', 'ticket:create:case-8472', 'tickets', "
    '\'{"title": "Printer on fire", "priority": 2}\');'
)


def url_of(engine: Engine) -> str:
    return engine.url.render_as_string(hide_password=False)


def recent(ts: datetime) -> bool:
    now = datetime.now(UTC)
    return ts.tzinfo is not None and now - timedelta(minutes=5) <= ts <= now + timedelta(minutes=5)


def test_operation_insert_with_required_columns_only(engine: Engine) -> None:
    url = url_of(engine)
    run_cli(url, OP_INSERT)
    [row] = run_cli(
        url,
        "SELECT status, idempotency_key, attempts, state_revision, "
        "CASE WHEN requires_approval THEN 'yes' ELSE 'no' END, "
        "fencing_token IS NULL, payload_digest IS NULL, created_at, updated_at "
        "FROM outbox_operations;",
    )
    status, key, attempts, revision, approval, no_token, no_digest, created, updated = row
    assert (status, key, attempts, revision, approval) == (
        "pending",
        "acme:ticket:create:case-8472",
        "0",
        "0",
        "no",
    )
    assert no_token in ("1", "t") and no_digest in ("1", "t")
    if dialect_of(url) == "sqlite":
        assert SQLITE_TS.match(created) and SQLITE_TS.match(updated), (created, updated)
        assert run_cli(url, "SELECT typeof(created_at) FROM outbox_operations;") == [["text"]]

    with engine.connect() as conn:  # and it reads back as a valid record
        rec = api.get_operation(conn, tenant_id="acme", operation_id="ticket:create:case-8472")
    assert rec.status is OperationStatus.PENDING
    assert rec.idempotency_key == default_idempotency_key("acme", "ticket:create:case-8472")
    assert rec.payload == {"title": "Printer on fire", "priority": 2}
    assert rec.requires_approval is False and rec.attempts == 0
    assert recent(rec.created_at) and recent(rec.updated_at)
    assert rec.next_attempt_at is None and rec.deadline_at is None


def test_operation_insert_with_explicit_key_keeps_it(engine: Engine) -> None:
    url = url_of(engine)
    run_cli(
        url,
        OP_INSERT.replace("provider, payload)", "provider, payload, idempotency_key)").replace(
            "2}');", "2}', 'my-own-key');"
        ),
    )
    assert run_cli(url, "SELECT idempotency_key FROM outbox_operations;") == [["my-own-key"]]


def test_task_insert_with_required_columns_only(engine: Engine) -> None:
    url = url_of(engine)
    run_cli(url, "INSERT INTO outbox_tasks (tenant_id, task_id) VALUES ('acme', 'case-8472');")
    [row] = run_cli(
        url,
        "SELECT state_revision, phase IS NULL, cancelled_at IS NULL, created_at, updated_at "
        "FROM outbox_tasks;",
    )
    assert row[0] == "0" and row[1] in ("1", "t") and row[2] in ("1", "t")
    if dialect_of(url) == "sqlite":
        assert SQLITE_TS.match(row[3]) and SQLITE_TS.match(row[4])
    with engine.connect() as conn:
        task = api.load_task(conn, tenant_id="acme", task_id="case-8472")
    assert task.state_revision == 0 and recent(task.created_at) and task.operations == ()


def test_plain_sql_errors_reach_the_client(engine: Engine) -> None:
    url = url_of(engine)
    run_cli(url, OP_INSERT)
    with pytest.raises(CliError):  # (tenant_id, operation_id) is unique
        run_cli(url, OP_INSERT)
    with pytest.raises(CliError, match="immutable"):
        run_cli(url, 'UPDATE outbox_operations SET payload = \'{"title": "changed"}\';')
    with pytest.raises(CliError, match="append-only"):
        run_cli(
            url,
            "INSERT INTO outbox_events (tenant_id, kind, actor) "
            "VALUES ('acme', 'note', 'me'); DELETE FROM outbox_events;",
        )


def _cas_and_stage(url: str, expected: int, operation_id: str) -> None:
    """One statement: advance the checkpoint from ``expected`` and stage an operation only
    if that compare-and-set matched (docs/plain-sql.md, "guarded" form)."""
    now = NOW[dialect_of(url)]
    if dialect_of(url) == "postgresql":
        sql = f"""
        BEGIN;
        WITH advanced AS (
          UPDATE outbox_tasks
             SET state_revision = state_revision + 1, phase = 'ticket-requested',
                 state = '{{"step": {expected + 1}}}', updated_at = {now}
           WHERE tenant_id = 'acme' AND task_id = 'case-8472' AND state_revision = {expected}
          RETURNING tenant_id, task_id
        )
        INSERT INTO outbox_operations (tenant_id, task_id, operation_id, provider, payload)
        SELECT tenant_id, task_id, '{operation_id}', 'tickets', '{{"title": "Printer"}}'
          FROM advanced;
        COMMIT;
        """
    else:
        sql = f"""
        BEGIN IMMEDIATE;
        UPDATE outbox_tasks
           SET state_revision = state_revision + 1, phase = 'ticket-requested',
               state = '{{"step": {expected + 1}}}', updated_at = {now}
         WHERE tenant_id = 'acme' AND task_id = 'case-8472' AND state_revision = {expected};
        INSERT INTO outbox_operations (tenant_id, task_id, operation_id, provider, payload)
        SELECT 'acme', 'case-8472', '{operation_id}', 'tickets', '{{"title": "Printer"}}'
         WHERE changes() = 1;
        COMMIT;
        """
    run_cli(url, sql)


def test_guarded_checkpoint_and_stage_in_one_transaction(engine: Engine) -> None:
    url = url_of(engine)
    run_cli(
        url,
        "INSERT INTO outbox_tasks (tenant_id, task_id, phase) "
        "VALUES ('acme', 'case-8472', 'triage');",
    )
    _cas_and_stage(url, 0, "ticket:create:1")
    _cas_and_stage(url, 0, "ticket:create:stale")  # stale writer: nothing happens
    _cas_and_stage(url, 1, "ticket:create:2")
    with engine.connect() as conn:
        task = api.load_task(conn, tenant_id="acme", task_id="case-8472")
    assert task.state_revision == 2 and task.state == {"step": 2}
    assert [o.operation_id for o in task.operations] == ["ticket:create:1", "ticket:create:2"]
    assert all(o.idempotency_key == f"acme:{o.operation_id}" for o in task.operations)


def test_driver_checks_the_row_count_and_rolls_back(engine: Engine) -> None:
    """The usual form: a driver's row count decides between COMMIT and ROLLBACK."""
    url = url_of(engine)
    run_cli(url, "INSERT INTO outbox_tasks (tenant_id, task_id) VALUES ('acme', 'case-8472');")
    pg = dialect_of(url) == "postgresql"
    mark = "%s" if pg else "?"
    cas = (
        f"UPDATE outbox_tasks SET state_revision = state_revision + 1, phase = {mark}, "
        f"updated_at = {NOW[dialect_of(url)]} "
        f"WHERE tenant_id = 'acme' AND task_id = 'case-8472' AND state_revision = {mark}"
    )
    stage = (
        "INSERT INTO outbox_operations (tenant_id, task_id, operation_id, provider, payload) "
        f"VALUES ('acme', 'case-8472', {mark}, 'tickets', {mark})"
    )

    def step(expected: int, operation_id: str) -> bool:
        conn: sqlite3.Connection | psycopg.Connection[tuple[object, ...]]
        if pg:
            conn = psycopg.connect(libpq_dsn(url))
        else:
            conn = sqlite3.connect(sqlite_path(url), isolation_level=None)
            conn.execute("BEGIN IMMEDIATE")
        try:
            cur = conn.cursor()
            cur.execute(cas, (f"after-{expected}", expected))  # type: ignore[arg-type]
            if cur.rowcount != 1:
                conn.rollback()
                return False
            cur.execute(stage, (operation_id, '{"n": 1}'))  # type: ignore[arg-type]
            conn.commit()
            return True
        finally:
            conn.close()

    assert step(0, "op-a") is True
    assert step(0, "op-stale") is False
    assert peek(url, "SELECT state_revision, phase FROM outbox_tasks") == [(1, "after-0")]
    assert peek(url, "SELECT operation_id FROM outbox_operations") == [("op-a",)]


def test_plain_sql_cancellation(engine: Engine) -> None:
    url = url_of(engine)
    run_cli(url, "INSERT INTO outbox_tasks (tenant_id, task_id) VALUES ('acme', 'case-8472');")
    run_cli(url, OP_INSERT)
    now = NOW[dialect_of(url)]
    run_cli(
        url,
        f"UPDATE outbox_tasks SET cancelled_at = {now}, cancel_reason = 'withdrawn', "
        f"updated_at = {now} WHERE tenant_id = 'acme' AND task_id = 'case-8472';",
    )
    with engine.begin() as conn:  # what the dispatcher's recovery job runs
        swept = api.sweep_cancelled(conn, actor="outboxd")
    assert swept.cancelled == ("ticket:create:case-8472",)
    assert run_cli(url, "SELECT status, status_reason FROM outbox_operations;") == [
        ["cancelled", "task_cancelled"]
    ]
    with engine.connect() as conn:
        task = api.load_task(conn, tenant_id="acme", task_id="case-8472")
    assert task.cancelled_at is not None and recent(task.cancelled_at)


# --------------------------------------------------------------------- admission

MALFORMED = {
    # operation_id: (provider, payload JSON text, payload_digest or NULL, expected reason)
    "m:array": ("tickets", "[1, 2, 3]", None, admission.PAYLOAD_NOT_OBJECT),
    "m:string": ("tickets", '"just text"', None, admission.PAYLOAD_NOT_OBJECT),
    "m:number": ("tickets", "42", None, admission.PAYLOAD_NOT_OBJECT),
    "m:provider": ("nonesuch", '{"title": "x"}', None, admission.UNKNOWN_PROVIDER),
    "m:oversize": ("tickets", '{"text": "' + "x" * 600 + '"}', None, admission.PAYLOAD_TOO_LARGE),
    "m:secret": (
        "tickets",
        '{"user": {"password": "Tr0ub4dor&3-horse"}}',
        None,
        admission.CREDENTIAL_IN_PAYLOAD,
    ),
    "m:digest": ("tickets", '{"title": "x"}', "sha256:" + "0" * 64, admission.DIGEST_MISMATCH),
    "m:big-int": ("tickets", '{"n": 18014398509481984}', None, admission.PAYLOAD_INVALID),
}


def test_admission_gives_each_malformed_sql_row_its_reason(engine: Engine) -> None:
    url = url_of(engine)
    good = {"title": "ok", "nested": {"b": 2, "a": 1}}
    values = [
        f"('acme', 'case-1', '{op_id}', '{prov}', '{text}', "
        f"{'NULL' if digest is None else repr(digest)})"
        for op_id, (prov, text, digest, _) in MALFORMED.items()
    ]
    values.append(
        f"('acme', 'case-1', 'good', 'tickets', '{{\"title\": \"ok\", "
        f'"nested": {{"b": 2, "a": 1}}}}\', \'{payload_digest(good)}\')'
    )
    values.append("('acme', 'case-1', 'good-nodigest', 'tickets', '{\"title\": \"ok\"}', NULL)")
    run_cli(
        url,
        "INSERT INTO outbox_operations (tenant_id, task_id, operation_id, provider, "
        "payload, payload_digest) VALUES " + ", ".join(values) + ";",
    )

    with engine.connect() as conn:
        rows = api.list_operations(conn, tenant_id="acme", task_id="case-1")
    results = {
        r.operation_id: admission.admit(r, known_providers={"tickets"}, max_payload_bytes=512)
        for r in rows
    }
    for op_id, (_, _, _, reason) in MALFORMED.items():
        assert (results[op_id].ok, results[op_id].reason) == (False, reason), op_id
    secret = results["m:secret"]
    assert secret.detail is not None and "$.user.password" in secret.detail
    assert "Tr0ub4dor" not in secret.detail
    assert results["good"].ok and results["good"].digest == payload_digest(good)
    assert results["good-nodigest"].ok
    assert results["good-nodigest"].digest == payload_digest({"title": "ok"})


def test_admission_schema_compatibility(engine: Engine) -> None:
    url = url_of(engine)
    run_cli(
        url,
        "INSERT INTO outbox_operations (tenant_id, task_id, operation_id, provider, "
        "payload, payload_schema) VALUES "
        "('acme', 'c', 'v1', 'tickets', '{\"a\": 1}', NULL), "
        "('acme', 'c', 'v3', 'tickets', '{\"a\": 1}', 3);",
    )
    with engine.connect() as conn:
        rows = {r.operation_id: r for r in api.list_operations(conn, tenant_id="acme", task_id="c")}
    kw = {"known_providers": {"tickets"}, "max_payload_bytes": 1000, "supported_schemas": {1, 2}}
    assert admission.admit(rows["v1"], **kw).ok  # type: ignore[arg-type]
    v3 = admission.admit(rows["v3"], **kw)  # type: ignore[arg-type]
    assert v3.reason == admission.INCOMPATIBLE_PAYLOAD_SCHEMA


def test_admission_of_a_json_null_payload(engine: Engine) -> None:
    url = url_of(engine)
    run_cli(
        url,
        "INSERT INTO outbox_operations (tenant_id, task_id, operation_id, provider, "
        "payload) VALUES ('acme', 'c', 'null', 'tickets', 'null');",
    )
    with engine.connect() as conn:
        [row] = api.list_operations(conn, tenant_id="acme", task_id="c")
        raw = conn.execute(sa.text("SELECT payload IS NULL FROM outbox_operations")).scalar()
    assert not raw  # JSON null is stored, the CHECK (payload or ref) passed
    result = admission.admit(row, known_providers={"tickets"}, max_payload_bytes=1000)
    assert result.reason == admission.PAYLOAD_NOT_OBJECT


# --------------------------------------------------------------------- the documentation

DOC = Path(__file__).resolve().parents[2] / "docs" / "plain-sql.md"


def doc_blocks(dialect: str) -> list[str]:
    """The ```sql blocks of docs/plain-sql.md that apply to ``dialect``."""
    blocks = re.findall(r"```sql\n(.*?)```", DOC.read_text(), flags=re.DOTALL)
    tag = {"postgresql": "-- PostgreSQL", "sqlite": "-- SQLite"}
    other = tag["sqlite" if dialect == "postgresql" else "postgresql"]
    return [b for b in blocks if not b.lstrip().startswith(other)]


def test_every_sql_block_of_the_documentation_runs(engine: Engine) -> None:
    url = url_of(engine)
    blocks = doc_blocks(dialect_of(url))
    assert len(blocks) == 8
    [create_task] = [b for b in blocks if "INSERT INTO outbox_tasks" in b]
    for block in blocks:
        run_cli(
            url,
            "DELETE FROM outbox_operations; DELETE FROM outbox_tasks; "
            "UPDATE outbox_meta SET value = '262144' WHERE name = 'max_payload_bytes';",
        )
        if block is not create_task:
            run_cli(url, create_task)
        refusal = re.search(r"-- ERROR: (.*)", block)
        if refusal is not None:  # a block that shows what the database refuses
            with pytest.raises(CliError, match=re.escape(refusal.group(1))):
                run_cli(url, block)
            assert peek(url, "SELECT count(*) FROM outbox_operations") == [(0,)]
            continue
        run_cli(url, block)
        if "INSERT INTO outbox_operations" in block:
            assert peek(
                url, "SELECT operation_id, idempotency_key, status FROM outbox_operations"
            ) == [("ticket:create:case-8472", "acme:ticket:create:case-8472", "pending")], block
        if "state_revision = 0" in block:
            assert peek(url, "SELECT state_revision FROM outbox_tasks") == [(1,)], block
        if "cancelled_at" in block:
            with engine.begin() as conn:
                task = api.load_task(conn, tenant_id="acme", task_id="case-8472")
            assert task.cancelled_at is not None and recent(task.cancelled_at), block
        if "max_payload_bytes" in block:
            assert peek(url, "SELECT value FROM outbox_meta WHERE name = 'max_payload_bytes'") == [
                ("65536",)
            ]
