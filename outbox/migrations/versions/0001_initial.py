"""initial: every outbox table, its indexes and the database-side rules (outbox.ddl)

Revision ID: 0001
Revises:
Create Date: 2026-12-02 17:00:26.333046
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

from outbox.migrations import rules_0001 as ddl
from outbox.types import UtcDateTime, db_now

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:

    op.create_table(
        "outbox_approvals",
        sa.Column(
            "id",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            autoincrement=True,
            nullable=False,
        ),
        sa.Column("tenant_id", sa.Text(), nullable=False),
        sa.Column("operation_id", sa.Text(), nullable=False),
        sa.Column("payload_hash", sa.Text(), nullable=False),
        sa.Column("approved_by", sa.Text(), nullable=False),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.Column("approved_at", UtcDateTime(), server_default=db_now(), nullable=False),
        sa.Column("expires_at", UtcDateTime(), nullable=True),
        sa.Column("revoked_at", UtcDateTime(), nullable=True),
        sa.Column("revoked_by", sa.Text(), nullable=True),
        sa.Column("consumed_at", UtcDateTime(), nullable=True),
        sa.Column("consumed_fencing_token", sa.BigInteger(), nullable=True),
        sa.Column("created_at", UtcDateTime(), server_default=db_now(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_outbox_approvals")),
    )
    with op.batch_alter_table("outbox_approvals", schema=None) as batch_op:
        batch_op.create_index(
            "ix_outbox_approvals_operation", ["tenant_id", "operation_id"], unique=False
        )

    op.create_table(
        "outbox_attempts",
        sa.Column(
            "id",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            autoincrement=True,
            nullable=False,
        ),
        sa.Column("tenant_id", sa.Text(), nullable=False),
        sa.Column("operation_id", sa.Text(), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("fencing_token", sa.BigInteger(), nullable=True),
        sa.Column("worker", sa.Text(), nullable=True),
        sa.Column("provider", sa.Text(), nullable=True),
        sa.Column("started_at", UtcDateTime(), nullable=True),
        sa.Column("finished_at", UtcDateTime(), nullable=True),
        sa.Column("result_class", sa.Text(), nullable=False),
        sa.Column("status_code", sa.Integer(), nullable=True),
        sa.Column("error_class", sa.Text(), nullable=True),
        sa.Column("transport_phase", sa.Text(), nullable=True),
        sa.Column("request_digest", sa.Text(), nullable=True),
        sa.Column("duration_ms", sa.Float(), nullable=True),
        sa.Column(
            "evidence",
            sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql"),
            nullable=True,
        ),
        sa.Column("evidence_ref", sa.Text(), nullable=True),
        sa.Column("created_at", UtcDateTime(), server_default=db_now(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_outbox_attempts")),
    )
    with op.batch_alter_table("outbox_attempts", schema=None) as batch_op:
        batch_op.create_index("ix_outbox_attempts_created", ["created_at"], unique=False)
        batch_op.create_index(
            "ix_outbox_attempts_operation", ["tenant_id", "operation_id"], unique=False
        )

    op.create_table(
        "outbox_events",
        sa.Column(
            "id",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            autoincrement=True,
            nullable=False,
        ),
        sa.Column("tenant_id", sa.Text(), nullable=False),
        sa.Column("task_id", sa.Text(), nullable=True),
        sa.Column("operation_id", sa.Text(), nullable=True),
        sa.Column("kind", sa.Text(), nullable=False),
        sa.Column("from_status", sa.Text(), nullable=True),
        sa.Column("to_status", sa.Text(), nullable=True),
        sa.Column("actor", sa.Text(), nullable=False),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.Column("evidence_ref", sa.Text(), nullable=True),
        sa.Column(
            "detail",
            sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql"),
            nullable=True,
        ),
        sa.Column("fencing_token", sa.BigInteger(), nullable=True),
        sa.Column("created_at", UtcDateTime(), server_default=db_now(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_outbox_events")),
    )
    with op.batch_alter_table("outbox_events", schema=None) as batch_op:
        batch_op.create_index("ix_outbox_events_created", ["created_at"], unique=False)
        batch_op.create_index(
            "ix_outbox_events_operation", ["tenant_id", "operation_id"], unique=False
        )

    op.create_table(
        "outbox_meta",
        sa.Column("tenant_id", sa.Text(), server_default="*", nullable=False),
        sa.Column("name", sa.Text(), nullable=False),
        sa.Column("value", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("tenant_id", "name", name=op.f("pk_outbox_meta")),
    )
    op.create_table(
        "outbox_operations",
        sa.Column(
            "id",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            autoincrement=True,
            nullable=False,
        ),
        sa.Column("tenant_id", sa.Text(), nullable=False),
        sa.Column("task_id", sa.Text(), nullable=False),
        sa.Column("operation_id", sa.Text(), nullable=False),
        sa.Column("provider", sa.Text(), nullable=False),
        sa.Column(
            "payload",
            sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql"),
            nullable=True,
        ),
        sa.Column("payload_ref", sa.Text(), nullable=True),
        sa.Column("payload_digest", sa.Text(), nullable=True),
        sa.Column("idempotency_key", sa.Text(), nullable=True),
        sa.Column("requires_approval", sa.Boolean(), server_default=sa.false(), nullable=False),
        sa.Column("deadline_at", UtcDateTime(), nullable=True),
        sa.Column("ordering_key", sa.Text(), nullable=True),
        sa.Column("max_attempts", sa.Integer(), nullable=True),
        sa.Column("max_elapsed_seconds", sa.Float(), nullable=True),
        sa.Column("workflow_version", sa.Text(), nullable=True),
        sa.Column("payload_schema", sa.Integer(), nullable=True),
        sa.Column("traceparent", sa.Text(), nullable=True),
        sa.Column("status", sa.Text(), server_default="pending", nullable=False),
        sa.Column("fencing_token", sa.BigInteger(), nullable=True),
        sa.Column("lease_owner", sa.Text(), nullable=True),
        sa.Column("lease_expires_at", UtcDateTime(), nullable=True),
        sa.Column("attempts", sa.Integer(), server_default="0", nullable=False),
        sa.Column("first_dispatched_at", UtcDateTime(), nullable=True),
        sa.Column("last_attempt_started_at", UtcDateTime(), nullable=True),
        sa.Column("last_outcome", sa.Text(), nullable=True),
        sa.Column("next_attempt_at", UtcDateTime(), nullable=True),
        sa.Column(
            "receipt",
            sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql"),
            nullable=True,
        ),
        sa.Column("status_reason", sa.Text(), nullable=True),
        sa.Column("state_revision", sa.BigInteger(), server_default="0", nullable=False),
        sa.Column("created_at", UtcDateTime(), server_default=db_now(), nullable=False),
        sa.Column("updated_at", UtcDateTime(), server_default=db_now(), nullable=False),
        sa.CheckConstraint(
            "status IN ('pending', 'claimed', 'dispatching', 'applied', 'verified', 'rejected', 'unknown', 'blocked', 'cancelled')",
            name=op.f("ck_outbox_operations_status_valid"),
        ),
        sa.CheckConstraint(
            "status NOT IN ('claimed', 'dispatching') OR (lease_expires_at IS NOT NULL AND fencing_token IS NOT NULL)",
            name=op.f("ck_outbox_operations_leased_has_lease"),
        ),
        sa.CheckConstraint("attempts >= 0", name=op.f("ck_outbox_operations_attempts_nonnegative")),
        sa.CheckConstraint(
            "payload IS NOT NULL OR payload_ref IS NOT NULL",
            name=op.f("ck_outbox_operations_payload_or_ref"),
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_outbox_operations")),
        sa.UniqueConstraint(
            "tenant_id", "operation_id", name=op.f("uq_outbox_operations_tenant_id_operation_id")
        ),
        sa.UniqueConstraint(
            "tenant_id",
            "provider",
            "idempotency_key",
            name=op.f("uq_outbox_operations_tenant_id_provider_idempotency_key"),
        ),
    )
    with op.batch_alter_table("outbox_operations", schema=None) as batch_op:
        batch_op.create_index(
            "ix_outbox_operations_leased_expiry",
            ["lease_expires_at"],
            unique=False,
            postgresql_where=sa.text("status IN ('claimed', 'dispatching')"),
            sqlite_where=sa.text("status IN ('claimed', 'dispatching')"),
        )
        batch_op.create_index(
            "ix_outbox_operations_ordering",
            ["ordering_key", "id"],
            unique=False,
            postgresql_where=sa.text("ordering_key IS NOT NULL"),
            sqlite_where=sa.text("ordering_key IS NOT NULL"),
        )
        batch_op.create_index(
            "ix_outbox_operations_pending_due",
            ["next_attempt_at", "id"],
            unique=False,
            postgresql_where=sa.text("status = 'pending'"),
            sqlite_where=sa.text("status = 'pending'"),
        )
        batch_op.create_index(
            "ix_outbox_operations_pending_id",
            ["id"],
            unique=False,
            postgresql_where=sa.text("status = 'pending'"),
            sqlite_where=sa.text("status = 'pending'"),
        )
        batch_op.create_index(
            "ix_outbox_operations_status_updated", ["status", "updated_at"], unique=False
        )
        batch_op.create_index("ix_outbox_operations_task", ["tenant_id", "task_id"], unique=False)

    op.create_table(
        "outbox_tasks",
        sa.Column(
            "id",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            autoincrement=True,
            nullable=False,
        ),
        sa.Column("tenant_id", sa.Text(), nullable=False),
        sa.Column("task_id", sa.Text(), nullable=False),
        sa.Column("workflow_version", sa.Text(), nullable=True),
        sa.Column("state_revision", sa.BigInteger(), server_default="0", nullable=False),
        sa.Column("phase", sa.Text(), nullable=True),
        sa.Column(
            "state",
            sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql"),
            nullable=True,
        ),
        sa.Column("cancelled_at", UtcDateTime(), nullable=True),
        sa.Column("cancel_reason", sa.Text(), nullable=True),
        sa.Column("deadline_at", UtcDateTime(), nullable=True),
        sa.Column("max_attempts", sa.Integer(), nullable=True),
        sa.Column("max_elapsed_seconds", sa.Float(), nullable=True),
        sa.Column("legal_hold_owner", sa.Text(), nullable=True),
        sa.Column("legal_hold_review_at", UtcDateTime(), nullable=True),
        sa.Column("created_at", UtcDateTime(), server_default=db_now(), nullable=False),
        sa.Column("updated_at", UtcDateTime(), server_default=db_now(), nullable=False),
        sa.CheckConstraint(
            "state_revision >= 0", name=op.f("ck_outbox_tasks_revision_nonnegative")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_outbox_tasks")),
        sa.UniqueConstraint("tenant_id", "task_id", name=op.f("uq_outbox_tasks_tenant_id_task_id")),
    )

    _install_rules()


def downgrade() -> None:
    _drop_rules()

    op.drop_table("outbox_tasks")
    with op.batch_alter_table("outbox_operations", schema=None) as batch_op:
        batch_op.drop_index("ix_outbox_operations_task")
        batch_op.drop_index("ix_outbox_operations_status_updated")
        batch_op.drop_index(
            "ix_outbox_operations_pending_id",
            postgresql_where=sa.text("status = 'pending'"),
            sqlite_where=sa.text("status = 'pending'"),
        )
        batch_op.drop_index(
            "ix_outbox_operations_pending_due",
            postgresql_where=sa.text("status = 'pending'"),
            sqlite_where=sa.text("status = 'pending'"),
        )
        batch_op.drop_index(
            "ix_outbox_operations_ordering",
            postgresql_where=sa.text("ordering_key IS NOT NULL"),
            sqlite_where=sa.text("ordering_key IS NOT NULL"),
        )
        batch_op.drop_index(
            "ix_outbox_operations_leased_expiry",
            postgresql_where=sa.text("status IN ('claimed', 'dispatching')"),
            sqlite_where=sa.text("status IN ('claimed', 'dispatching')"),
        )

    op.drop_table("outbox_operations")
    op.drop_table("outbox_meta")
    with op.batch_alter_table("outbox_events", schema=None) as batch_op:
        batch_op.drop_index("ix_outbox_events_operation")
        batch_op.drop_index("ix_outbox_events_created")

    op.drop_table("outbox_events")
    with op.batch_alter_table("outbox_attempts", schema=None) as batch_op:
        batch_op.drop_index("ix_outbox_attempts_operation")
        batch_op.drop_index("ix_outbox_attempts_created")

    op.drop_table("outbox_attempts")
    with op.batch_alter_table("outbox_approvals", schema=None) as batch_op:
        batch_op.drop_index("ix_outbox_approvals_operation")

    op.drop_table("outbox_approvals")


def _schema() -> str | None:
    config = op.get_context().config
    schema = config.attributes.get("schema") if config is not None else None
    return schema if isinstance(schema, str) else None


def _install_rules() -> None:
    dialect = op.get_bind().dialect.name
    stmts = ddl.sqlite_statements() if dialect == "sqlite" else ddl.postgresql_statements(_schema())
    for stmt in stmts:
        op.execute(stmt)


def _drop_rules() -> None:
    dialect = op.get_bind().dialect.name
    stmts = (
        ddl.sqlite_drop_statements()
        if dialect == "sqlite"
        else ddl.postgresql_drop_statements(_schema())
    )
    for stmt in stmts:
        op.execute(stmt)
