"""Apply and inspect the migrations shipped in :mod:`outbox.migrations`.

``outboxd migrate`` calls :func:`upgrade`; the daemon calls :func:`check_current` at
start-up and ``/readyz`` reports it. A database at a revision this code does not know
(a newer release migrated it) is refused with both revisions named.
"""

from __future__ import annotations

import io
from collections.abc import Mapping
from pathlib import Path

import sqlalchemy as sa
from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy.engine import Engine

from outbox.errors import MigrationError

MIGRATIONS = Path(__file__).parent / "migrations"


def _config(schema: str | None = None) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    cfg.attributes["schema"] = schema
    return cfg


def head() -> str:
    """The newest revision this code ships."""
    rev = ScriptDirectory.from_config(_config()).get_current_head()
    assert rev is not None
    return rev


def known_revisions() -> set[str]:
    return {s.revision for s in ScriptDirectory.from_config(_config()).walk_revisions()}


def current(engine: Engine, schema: str | None = None) -> str | None:
    """The database's revision, or None if it was never migrated."""
    with engine.connect() as conn:
        ctx = MigrationContext.configure(conn, opts={"version_table_schema": schema})
        return ctx.get_current_revision()


def upgrade(
    engine: Engine,
    schema: str | None = None,
    revision: str = "head",
    roles: Mapping[str, str] | None = None,
) -> str:
    """Migrate to ``revision`` (idempotent). Returns the revision reached.

    ``roles`` names the PostgreSQL roles the migrations create and grant to
    (``{"agent": ..., "dispatcher": ..., "operator": ..., "retention": ...}``)."""
    now = current(engine, schema)
    if now is not None and now not in known_revisions():
        raise MigrationError(
            "the database was migrated by a newer outboxd", database=now, code=head()
        )
    with engine.begin() as conn:
        if schema and conn.dialect.name == "postgresql":
            conn.exec_driver_sql(f'CREATE SCHEMA IF NOT EXISTS "{schema}"')
        cfg = _config(schema)
        cfg.attributes["connection"] = conn
        for kind, name in (roles or {}).items():
            cfg.attributes[f"{kind}_role"] = name
        command.upgrade(cfg, revision)
    reached = current(engine, schema)
    assert reached is not None
    return reached


def downgrade(engine: Engine, revision: str, schema: str | None = None) -> None:
    with engine.begin() as conn:
        cfg = _config(schema)
        cfg.attributes["connection"] = conn
        command.downgrade(cfg, revision)


def check_current(engine: Engine, schema: str | None = None) -> None:
    """Raise :class:`MigrationError` unless the database is at this code's head."""
    now, code = current(engine, schema), head()
    if now == code:
        return
    if now is None:
        raise MigrationError("the database is not migrated: run `outboxd migrate`", code=code)
    if now not in known_revisions():
        raise MigrationError(
            "the database was migrated by a newer outboxd", database=now, code=code
        )
    raise MigrationError("the database is behind: run `outboxd migrate`", database=now, code=code)


def sql_script(url: str, schema: str | None = None) -> str:
    """The DDL of every migration, for a DBA (``outboxd migrate --sql``)."""
    buf = io.StringIO()
    if schema and not url.startswith("sqlite"):
        # As upgrade() does online: the schema must exist, and the tables (created without
        # a schema) must land in it, where the triggers and alembic_version refer to them.
        buf.write(f'CREATE SCHEMA IF NOT EXISTS "{schema}";\n\n')
        buf.write(f'SET search_path TO "{schema}", public;\n\n')
    cfg = _config(schema)
    cfg.output_buffer = buf
    cfg.attributes["url"] = (
        sa.engine.make_url(url).set(database=None).render_as_string(hide_password=False)
        if not url.startswith("sqlite")
        else "sqlite://"
    )
    command.upgrade(cfg, "head", sql=True)
    return buf.getvalue()
