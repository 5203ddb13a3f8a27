"""the task index ends with the row's id: one entry per row, not one posting list per task

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-07 19:00:00.000000

``ix_outbox_operations_task`` was ``(tenant_id, task_id)``; it is now ``(tenant_id,
task_id, id)``. A status change is never a HOT update on PostgreSQL (``status`` is in index
predicates), so each of a dispatch's two updates adds an entry for the new row version to
every index without a predicate, this one among them. Under ``(tenant_id, task_id)`` every
operation of a task shares one key: the entries of a task's rows, and of each of their
versions, pile up as one long run of duplicates (a posting list, split and rewritten as
versions arrive and are cleaned away), which the server searched and rewrote on every
update: without the index at all, a drain at batch 100 took about a sixth less of the
database's CPU. With the id as its last column each row has a key of its own, and its
versions' entries sit side by side, as in the unique indexes: about a tenth less, the drain
1.14x (``docs/performance.md``). Reads by task find the same rows through the same prefix,
now in ``id`` order. On SQLite (an index holds the rowid anyway) the
index is rebuilt the same way, for one schema on both dialects.
"""

from __future__ import annotations

from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None

OPS = "outbox_operations"
INDEX = "ix_outbox_operations_task"


def _schema() -> str | None:
    config = op.get_context().config
    schema = config.attributes.get("schema") if config is not None else None
    return schema if isinstance(schema, str) else None


def upgrade() -> None:
    schema = _schema()
    op.drop_index(INDEX, table_name=OPS, schema=schema)
    op.create_index(INDEX, OPS, ["tenant_id", "task_id", "id"], schema=schema)


def downgrade() -> None:
    schema = _schema()
    op.drop_index(INDEX, table_name=OPS, schema=schema)
    op.create_index(INDEX, OPS, ["tenant_id", "task_id"], schema=schema)
