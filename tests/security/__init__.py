"""Security tests: roles, row-level security, retention and erasure on real databases.

PostgreSQL tests migrate a fresh database with role names unique to it (``sec_<hex>_agent``
...) and drop those roles afterwards: roles are cluster-wide. Statements run as the
non-owner roles (``SET LOCAL ROLE`` or a login role granted membership) with RLS FORCED.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import psycopg
import pytest
import sqlalchemy as sa
from alembic import command
from alembic.config import Config
from sqlalchemy.engine import Connection, Engine

from outbox import db, migrate
from outbox.tenancy import set_tenant
from tests.conftest import drop_pg_database, new_pg_database

KINDS = ("agent", "dispatcher", "operator", "retention")


@dataclass
class SecureDb:
    url: str
    admin_dsn: str
    roles: dict[str, str]
    logins: list[str]

    def login(self, kind: str) -> str:
        """A LOGIN role granted ``kind``'s role (as a deployment would); returns its URL."""
        name = f"{self.roles[kind]}_login"
        with psycopg.connect(self.admin_dsn, autocommit=True) as conn:
            conn.execute(f'CREATE ROLE "{name}" LOGIN')
            conn.execute(f'GRANT "{self.roles[kind]}" TO "{name}"')
        self.logins.append(name)
        rest = self.url.split("://", 1)[1].split("@", 1)[1]
        return f"postgresql+psycopg://{name}@{rest}"


def migrate_with_roles(url: str, roles: dict[str, str], revision: str = "head") -> None:
    engine = db.create_engine(url)
    try:
        with engine.begin() as conn:
            cfg = Config()
            cfg.set_main_option("script_location", str(migrate.MIGRATIONS))
            cfg.attributes.update(connection=conn, schema=None,
                                  **{f"{k}_role": v for k, v in roles.items()})
            command.upgrade(cfg, revision)
    finally:
        engine.dispose()


@pytest.fixture
def secure_db(pg_admin_dsn: str) -> Iterator[SecureDb]:
    prefix = f"sec_{uuid.uuid4().hex[:10]}"
    roles = {k: f"{prefix}_{k}" for k in KINDS}
    url = new_pg_database(pg_admin_dsn, migrated=False)
    sdb = SecureDb(url, pg_admin_dsn, roles, [])
    try:
        migrate_with_roles(url, roles)
        yield sdb
    finally:
        drop_pg_database(pg_admin_dsn, url)
        with psycopg.connect(pg_admin_dsn, autocommit=True) as conn:
            for name in [*sdb.logins, *roles.values()]:
                conn.execute(f'DROP ROLE IF EXISTS "{name}"')


def as_role(conn: Connection, role: str, tenant: str | None = None) -> None:
    """Become ``role`` for the rest of this transaction, scoped to ``tenant``."""
    conn.exec_driver_sql(f'SET LOCAL ROLE "{role}"')
    if tenant is not None:
        set_tenant(conn, tenant)


def outcome(engine: Engine, role: str, tenant: str | None, sql: str, **params: Any) -> Any:
    """Run ``sql`` as ``role`` in a transaction that is rolled back: the number of rows it
    returned or changed, or the SQLSTATE it failed with."""
    with engine.connect() as conn:
        conn.begin()
        as_role(conn, role, tenant)
        try:
            result = conn.execute(sa.text(sql), params)
            return len(result.all()) if result.returns_rows else result.rowcount
        except sa.exc.DBAPIError as exc:
            return getattr(exc.orig, "sqlstate", None) or str(exc.orig)
        finally:
            conn.rollback()


def seed_two_tenants(engine: Engine) -> None:
    """As the owner: tenants A and B, each with a task, a pending operation, an approval,
    an attempt and an event, whose payload holds a tenant-specific canary."""
    with engine.begin() as conn:
        for t in ("A", "B"):
            conn.execute(sa.text(
                "INSERT INTO outbox_tasks (tenant_id, task_id, state) "
                "VALUES (:t, 'task', '{\"s\": 1}')"), {"t": t})
            conn.execute(sa.text(
                "INSERT INTO outbox_operations (tenant_id, task_id, operation_id, provider, "
                "payload, receipt) VALUES (:t, 'task', 'op', 'p', "
                "CAST(:body AS jsonb), '{\"r\": 1}')"),
                {"t": t, "body": f'{{"secret_of": "canary-{t}"}}'})
            conn.execute(sa.text(
                "INSERT INTO outbox_approvals (tenant_id, operation_id, payload_hash, "
                "approved_by) VALUES (:t, 'op', 'h', 'boss')"), {"t": t})
            conn.execute(sa.text(
                "INSERT INTO outbox_attempts (tenant_id, operation_id, attempt, result_class, "
                "evidence) VALUES (:t, 'op', 1, 'applied', '{\"e\": 1}')"), {"t": t})
            conn.execute(sa.text(
                "INSERT INTO outbox_events (tenant_id, task_id, operation_id, kind, actor) "
                "VALUES (:t, 'task', 'op', 'note', 'test')"), {"t": t})
