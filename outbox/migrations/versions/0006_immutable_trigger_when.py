"""immutability rule: PostgreSQL's trigger asks its function only when a column changed

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-07 03:30:00.000000

``outbox_operations_immutable`` fires on an ``UPDATE`` that names one of the immutable
columns. The dispatcher's record names ``payload_digest`` for a row staged by plain SQL
(it stores the digest the first time it is known), so on PostgreSQL every such row's first
record ran the PL/pgSQL function, which found nothing changed. The trigger now carries a
``WHEN`` condition — evaluated by the executor, no function call — that holds whenever the
function could refuse the update: any immutable column changed, the payload included (the
function still allows the retention path's purge to ``null``). The function is unchanged,
and so is every update it refuses. SQLite's trigger already had its ``WHEN``.
"""

from __future__ import annotations

from alembic import op

from outbox.migrations import rules_0001 as ddl

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None

OPS = "outbox_operations"
TRIGGER = "outbox_operations_immutable"
# a superset of the function's refusals: it is asked whenever one of them could hold
CHANGED = """
    NEW.tenant_id IS DISTINCT FROM OLD.tenant_id
    OR NEW.operation_id IS DISTINCT FROM OLD.operation_id
    OR NEW.task_id IS DISTINCT FROM OLD.task_id
    OR NEW.provider IS DISTINCT FROM OLD.provider
    OR NEW.payload IS DISTINCT FROM OLD.payload
    OR NEW.payload_ref IS DISTINCT FROM OLD.payload_ref
    OR (OLD.payload_purged_at IS NOT NULL
        AND NEW.payload_purged_at IS DISTINCT FROM OLD.payload_purged_at)
    OR (OLD.payload_digest IS NOT NULL
        AND NEW.payload_digest IS DISTINCT FROM OLD.payload_digest)
    OR (OLD.idempotency_key IS NOT NULL
        AND NEW.idempotency_key IS DISTINCT FROM OLD.idempotency_key)
"""


def _q(name: str) -> str:
    config = op.get_context().config
    schema = config.attributes.get("schema") if config is not None else None
    return f'"{schema}".{name}' if isinstance(schema, str) and schema else name


def _create(when: str) -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    op.execute(f"DROP TRIGGER IF EXISTS {TRIGGER} ON {_q(OPS)}")
    op.execute(
        f"CREATE TRIGGER {TRIGGER} BEFORE UPDATE OF {ddl.IMMUTABLE_COLUMNS}, payload_purged_at"
        f" ON {_q(OPS)} FOR EACH ROW {when}EXECUTE FUNCTION {_q(TRIGGER)}()"
    )


def upgrade() -> None:
    _create(f"WHEN ({CHANGED}) ")


def downgrade() -> None:
    _create("")
