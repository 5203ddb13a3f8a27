"""status index at rest: ``(status, updated_at)`` only for rows off the dispatch path

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-06 16:40:00.000000

``ix_outbox_operations_status_updated`` becomes partial: ``WHERE status NOT IN ('pending',
'claimed', 'dispatching')``. A change of ``status`` can never be a HOT update on
PostgreSQL (the column is in index predicates), so every status change inserts an entry
into every index whose predicate the new row version meets; a dispatch moves its row three
times (claimed, dispatching, applied), and the full index took an entry each time. Rows on
the dispatch path are counted from the indexes that already hold them (the partial pending
indexes, the partial lease index), so the status index only needs the rows at rest:
``unknown``, ``blocked`` and the terminal statuses, which the gauges and retention read.
One entry per dispatch instead of three (``docs/performance.md`` has the figure).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

OPS = "outbox_operations"
INDEX = "ix_outbox_operations_status_updated"
AT_REST = "status NOT IN ('pending', 'claimed', 'dispatching')"


def _schema() -> str | None:
    config = op.get_context().config
    schema = config.attributes.get("schema") if config is not None else None
    return schema if isinstance(schema, str) else None


def upgrade() -> None:
    schema = _schema()
    op.drop_index(INDEX, table_name=OPS, schema=schema)
    op.create_index(INDEX, OPS, ["status", "updated_at"], schema=schema,
                    postgresql_where=sa.text(AT_REST), sqlite_where=sa.text(AT_REST))


def downgrade() -> None:
    schema = _schema()
    op.drop_index(INDEX, table_name=OPS, schema=schema)
    op.create_index(INDEX, OPS, ["status", "updated_at"], schema=schema)
