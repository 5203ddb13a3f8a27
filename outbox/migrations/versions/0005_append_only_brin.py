"""append-only tables: block-range indexes on PostgreSQL for their ``created_at``

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-06 16:30:00.000000

``outbox_events`` and ``outbox_attempts`` are append-only and written in time order, so on
PostgreSQL their ``created_at`` indexes become BRIN (one summary per range of table pages)
instead of B-trees (one entry per row): a dispatch appends three events and an attempt, and
each of those inserts took a B-tree entry here. The readers of these indexes ask for a time
range — retention's rows older than a period, the console's and ``outboxd status``'s recent
rows — which a block-range scan answers, the newest pages (not summarized yet) included.
SQLite keeps its B-trees (it has no BRIN).
"""

from __future__ import annotations

from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None

INDEXES = {"ix_outbox_events_created": "outbox_events",
           "ix_outbox_attempts_created": "outbox_attempts"}


def _schema() -> str | None:
    config = op.get_context().config
    schema = config.attributes.get("schema") if config is not None else None
    return schema if isinstance(schema, str) else None


def _rebuild(using: str) -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    schema = _schema()
    for index, table in INDEXES.items():
        op.drop_index(index, table_name=table, schema=schema)
        op.create_index(index, table, ["created_at"], schema=schema, postgresql_using=using)


def upgrade() -> None:
    _rebuild("brin")


def downgrade() -> None:
    _rebuild("btree")
