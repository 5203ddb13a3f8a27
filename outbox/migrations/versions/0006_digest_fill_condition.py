"""the payload digest's fill-once rule as a trigger condition on PostgreSQL

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-07 16:30:00.000000

The dispatcher writes the payload digest of a row staged with plain SQL (none stored) when
it records the row's first outcome: the record statement names ``payload_digest``. On
PostgreSQL ``outbox_operations_immutable`` fired for every UPDATE naming any column it
watched, so every such record ran the PL/pgSQL function once per row, to find nothing
changed but a digest filled from NULL, which the rules allow.

``outbox_operations_immutable`` now watches every protected column but the digest, and a
second trigger, ``outbox_operations_digest_once``, watches the digest with the rule as its
``WHEN`` condition — a stored digest changed — evaluated without calling any function; only
a row that breaks the rule reaches the same function, which refuses it with the same error.
Nothing else changes: what is refused and allowed is what 0002 refuses and allows.
SQLite's trigger already states its rule as a ``WHEN`` condition: unchanged there.
"""

from __future__ import annotations

from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None

OPS = "outbox_operations"
FUNCTION = "outbox_operations_immutable"
DIGEST_TRIGGER = "outbox_operations_digest_once"
WATCHED_BEFORE = (
    "tenant_id, task_id, operation_id, provider, payload, payload_ref, payload_digest, "
    "idempotency_key, payload_purged_at"
)
"""The columns ``outbox_operations_immutable`` watched from 0002 on."""
WATCHED = (
    "tenant_id, task_id, operation_id, provider, payload, payload_ref, idempotency_key, "
    "payload_purged_at"
)
DIGEST_CHANGED = (
    "OLD.payload_digest IS NOT NULL AND NEW.payload_digest IS DISTINCT FROM OLD.payload_digest"
)


def _schema() -> str | None:
    config = op.get_context().config
    schema = config.attributes.get("schema") if config is not None else None
    return schema if isinstance(schema, str) else None


def _q(name: str) -> str:
    schema = _schema()
    return f'"{schema}".{name}' if schema else name


def _immutable_trigger(columns: str) -> str:
    return (f"CREATE TRIGGER {FUNCTION} BEFORE UPDATE OF {columns} ON {_q(OPS)} "
            f"FOR EACH ROW EXECUTE FUNCTION {_q(FUNCTION)}()")


def upgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    op.execute(f"DROP TRIGGER IF EXISTS {FUNCTION} ON {_q(OPS)}")
    op.execute(_immutable_trigger(WATCHED))
    op.execute(f"DROP TRIGGER IF EXISTS {DIGEST_TRIGGER} ON {_q(OPS)}")
    op.execute(f"CREATE TRIGGER {DIGEST_TRIGGER} BEFORE UPDATE OF payload_digest ON {_q(OPS)} "
               f"FOR EACH ROW WHEN ({DIGEST_CHANGED}) EXECUTE FUNCTION {_q(FUNCTION)}()")


def downgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    op.execute(f"DROP TRIGGER IF EXISTS {DIGEST_TRIGGER} ON {_q(OPS)}")
    op.execute(f"DROP TRIGGER IF EXISTS {FUNCTION} ON {_q(OPS)}")
    op.execute(_immutable_trigger(WATCHED_BEFORE))
