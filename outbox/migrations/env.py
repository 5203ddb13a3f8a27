"""Alembic environment: run by :mod:`outbox.migrate`, never by a separate alembic.ini.

The connection (online) or dialect URL (offline, ``outboxd migrate --sql``) and the
PostgreSQL schema come from ``config.attributes``.
"""

from __future__ import annotations

from alembic import context

from outbox.schema import metadata

config = context.config
schema: str | None = config.attributes.get("schema")


def run_offline() -> None:
    context.configure(
        url=config.attributes["url"],
        target_metadata=metadata,
        literal_binds=True,
        version_table_schema=schema,
        dialect_opts={"paramstyle": "named"},
    )
    with context.begin_transaction():
        context.run_migrations()


def run_online() -> None:
    connection = config.attributes["connection"]
    context.configure(
        connection=connection,
        target_metadata=metadata,
        version_table_schema=schema,
        render_as_batch=connection.dialect.name == "sqlite",
    )
    with context.begin_transaction():
        context.run_migrations()


if context.is_offline_mode():
    run_offline()
else:
    run_online()
