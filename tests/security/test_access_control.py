"""The role x verb x tenant matrix on PostgreSQL with RLS FORCED, column grants, the
audited payload reveal, and the transaction-local tenant on pooled connections.

Expectations are exact: an int is the number of rows seen or changed; "42501" is
insufficient_privilege (no grant, or a row that fails an RLS WITH CHECK). RLS *filters*
rows of another tenant on SELECT/UPDATE (0 rows) and *refuses* inserting one (42501).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Engine

from outbox import api, db, errors
from outbox.tenancy import current_tenant, reveal_payload, set_tenant
from tests.security import (
    SecureDb,
    as_role,
    outcome,
    secure_db,  # noqa: F401  (fixture)
    seed_two_tenants,
)

pytestmark = pytest.mark.postgres
DENIED = "42501"
TABLES = ("outbox_tasks", "outbox_operations", "outbox_approvals", "outbox_attempts",
          "outbox_events")

# (role, verb) -> (own tenant A, other tenant B), on outbox_operations.
MATRIX: dict[tuple[str, str], tuple[object, object]] = {
    ("agent", "SELECT"): (1, 0),
    ("agent", "INSERT"): (1, DENIED),
    ("agent", "UPDATE"): (1, 0),  # cancel: own pending row yes, other tenant filtered
    ("agent", "DELETE"): (DENIED, DENIED),
    ("agent", "TRUNCATE"): (DENIED, DENIED),
    ("operator", "SELECT"): (1, 0),  # metadata columns only
    ("operator", "INSERT"): (DENIED, DENIED),
    ("operator", "UPDATE"): (1, 0),
    ("operator", "DELETE"): (DENIED, DENIED),
    ("operator", "TRUNCATE"): (DENIED, DENIED),
    ("dispatcher", "SELECT"): (1, 1),  # cross-tenant by design
    ("dispatcher", "INSERT"): (DENIED, DENIED),
    ("dispatcher", "UPDATE"): (1, 1),
    ("dispatcher", "DELETE"): (DENIED, DENIED),
    ("dispatcher", "TRUNCATE"): (DENIED, DENIED),
    ("retention", "SELECT"): (1, 1),  # cross-tenant by design
    ("retention", "INSERT"): (DENIED, DENIED),
    ("retention", "UPDATE"): (1, 1),
    ("retention", "DELETE"): (DENIED, DENIED),
    ("retention", "TRUNCATE"): (DENIED, DENIED),
}
SQL = {
    "SELECT": "SELECT id, tenant_id, status FROM outbox_operations WHERE tenant_id = :t",
    "INSERT": "INSERT INTO outbox_operations (tenant_id, task_id, operation_id, provider, "
              "payload) VALUES (:t, 'task', 'new', 'p', '{\"a\": 1}')",
    "UPDATE": "UPDATE outbox_operations SET status = 'cancelled', status_reason = 'm' "
              "WHERE tenant_id = :t AND status = 'pending'",
    "DELETE": "DELETE FROM outbox_operations WHERE tenant_id = :t",
    "TRUNCATE": "TRUNCATE outbox_operations",
}


@pytest.fixture
def seeded(secure_db: SecureDb) -> Iterator[tuple[SecureDb, Engine]]:  # noqa: F811
    engine = db.create_engine(secure_db.url)
    seed_two_tenants(engine)
    yield secure_db, engine
    engine.dispose()


def test_role_verb_tenant_matrix(seeded: tuple[SecureDb, Engine]) -> None:
    sdb, engine = seeded
    got = {}
    for (kind, verb), _ in MATRIX.items():
        got[(kind, verb)] = tuple(
            outcome(engine, sdb.roles[kind], "A", SQL[verb], t=t) for t in ("A", "B"))
    assert got == MATRIX


@pytest.mark.parametrize("kind", ["agent", "operator"])
def test_tenant_roles_see_and_change_nothing_of_another_tenant(
    seeded: tuple[SecureDb, Engine], kind: str
) -> None:
    sdb, engine = seeded
    role = sdb.roles[kind]
    for table in TABLES:
        assert outcome(engine, role, "A", f"SELECT tenant_id FROM {table}") == 1, table
        assert outcome(engine, role, "A",
                       f"SELECT tenant_id FROM {table} WHERE tenant_id = 'B'") == 0, table
        assert outcome(engine, role, None, f"SELECT tenant_id FROM {table}") == 0, table
        assert outcome(engine, role, "A", f"DELETE FROM {table}") == DENIED, table
        assert outcome(engine, role, "A", f"TRUNCATE {table}") == DENIED, table
    assert outcome(engine, role, "A", "UPDATE outbox_tasks SET updated_at = now() "
                   "WHERE tenant_id = 'B'") in (0, DENIED)
    assert outcome(engine, role, "A", "INSERT INTO outbox_events (tenant_id, kind, actor) "
                   "VALUES ('B', 'forged', 'x')") == DENIED
    assert outcome(engine, role, "A", "INSERT INTO outbox_events (tenant_id, kind, actor) "
                   "VALUES ('A', 'note', 'x')") == 1


def test_the_agent_only_cancels_and_never_rewrites_an_operation(
    seeded: tuple[SecureDb, Engine]
) -> None:
    sdb, engine = seeded
    agent = sdb.roles["agent"]
    assert outcome(engine, agent, "A", "UPDATE outbox_operations SET status = 'applied' "
                   "WHERE tenant_id = 'A'") == DENIED  # RLS WITH CHECK: only 'cancelled'
    assert outcome(engine, agent, "A", "UPDATE outbox_operations SET payload = '{}'") == DENIED
    assert outcome(engine, agent, "A", "UPDATE outbox_operations SET receipt = '{}'") == DENIED
    assert outcome(engine, agent, "A", "UPDATE outbox_tasks SET legal_hold_owner = NULL"
                   ) == DENIED
    assert outcome(engine, agent, "A", "SELECT nextval('outbox_fencing_seq')") == DENIED


def test_the_dispatcher_writes_only_its_columns_and_appends_records(
    seeded: tuple[SecureDb, Engine]
) -> None:
    sdb, engine = seeded
    disp = sdb.roles["dispatcher"]
    assert outcome(engine, disp, None, "UPDATE outbox_operations SET payload = '{}'") == DENIED
    assert outcome(engine, disp, None, "UPDATE outbox_operations SET tenant_id = 'B'") == DENIED
    assert outcome(engine, disp, None, "UPDATE outbox_tasks SET state = '{}'") == DENIED
    assert outcome(engine, disp, None, "SELECT nextval('outbox_fencing_seq')") == 1
    assert outcome(engine, disp, None, "INSERT INTO outbox_attempts (tenant_id, operation_id, "
                   "attempt, result_class) VALUES ('B', 'op', 2, 'applied')") == 1
    for table in ("outbox_events", "outbox_attempts", "outbox_approvals", "outbox_tasks"):
        assert outcome(engine, disp, None, f"DELETE FROM {table}") == DENIED, table
    # the retention flag opens nothing for a role without the grant
    assert outcome(engine, disp, None, "SELECT set_config('outbox.retention_purge', 'on', "
                   "true); DELETE FROM outbox_events") == DENIED


def test_operators_read_metadata_not_bodies_and_reveal_is_audited(
    seeded: tuple[SecureDb, Engine]
) -> None:
    sdb, engine = seeded
    oper = sdb.roles["operator"]
    for sql in ("SELECT * FROM outbox_operations", "SELECT payload FROM outbox_operations",
                "SELECT receipt FROM outbox_operations", "SELECT state FROM outbox_tasks",
                "SELECT evidence FROM outbox_attempts"):
        assert outcome(engine, oper, "A", sql) == DENIED, sql
    assert outcome(engine, oper, "A", "SELECT operation_id, status, payload_digest, "
                   "status_reason, attempts FROM outbox_operations") == 1

    with engine.begin() as conn:
        as_role(conn, oper, "A")
        body = reveal_payload(conn, tenant_id="A", operation_id="op", actor="alice",
                              reason="ticket 42: customer dispute")
        with pytest.raises(sa.exc.DBAPIError) as caught, conn.begin_nested():
            conn.execute(sa.text("SELECT outbox_reveal_payload('B', 'op', 'alice', 'x')"))
        assert caught.value.orig.sqlstate == DENIED  # type: ignore[union-attr]
    assert body == {"secret_of": "canary-A"}
    with engine.connect() as conn:
        rows = conn.execute(sa.text(
            "SELECT tenant_id, actor, reason, detail FROM outbox_events "
            "WHERE kind = 'payload_revealed'")).all()
    assert [(r[0], r[1], r[2]) for r in rows] == [("A", "alice", "ticket 42: customer dispute")]
    assert rows[0][3]["db_user"]  # the database user is recorded as well
    with engine.connect() as conn:
        conn.begin()
        with pytest.raises(errors.InvalidPayload):
            reveal_payload(conn, tenant_id="A", operation_id="op", actor="alice", reason=" ")
    assert outcome(engine, sdb.roles["agent"], "A",
                   "SELECT outbox_reveal_payload('A', 'op', 'a', 'b')") == DENIED


def test_a_pooled_connection_reused_across_tenants_leaks_nothing(secure_db: SecureDb) -> None:  # noqa: F811
    engine = db.create_engine(secure_db.login("agent"), pool_size=1)
    try:
        for tenant in ("A", "B"):
            with engine.begin() as conn:
                api.advance(conn, "task", tenant_id=tenant, expected_revision=0, operations=[
                    api.StagedOperation("op", "p", {"body": f"canary-{tenant}"})])
        with engine.begin() as conn:
            set_tenant(conn, "A")
            pid = conn.exec_driver_sql("SELECT pg_backend_pid()").scalar()
            seen = conn.exec_driver_sql("SELECT tenant_id, payload FROM outbox_operations").all()
        assert [r[0] for r in seen] == ["A"]
        with engine.begin() as conn:  # same pooled connection, next transaction
            assert conn.exec_driver_sql("SELECT pg_backend_pid()").scalar() == pid
            assert current_tenant(conn) is None
            for table in TABLES:
                assert conn.exec_driver_sql(f"SELECT count(*) FROM {table}").scalar() == 0
        with engine.begin() as conn:
            task = api.load_task(conn, tenant_id="B", task_id="task")
            assert [o.payload for o in task.operations] == [{"body": "canary-B"}]
            assert conn.exec_driver_sql(
                "SELECT count(*) FROM outbox_operations WHERE tenant_id = 'A'").scalar() == 0
        with engine.begin() as conn:  # the API works for the agent role, cancel included
            result = api.cancel_task(conn, tenant_id="B", task_id="task", actor="agent-b")
        assert result.cancelled == ("op",)
        with engine.begin() as conn, pytest.raises(errors.OperationNotFound):
            api.get_operation(conn, tenant_id="A", operation_id="nope")
    finally:
        engine.dispose()
