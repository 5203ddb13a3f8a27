"""The records: every outbox table as a SQLAlchemy Core ``Table`` (one source of truth).

Column names are the product's contract (DESIGN "Records"). Tables are defined without a
schema; on PostgreSQL a configured schema is applied with ``schema_translate_map`` (see
:func:`outbox.db.execution_options`). Database-side rules (triggers: immutability,
append-only, default idempotency key, payload size) live in :mod:`outbox.ddl` and are
installed by the migrations.
"""

from __future__ import annotations

import sqlalchemy as sa

from outbox.states import OperationStatus, sql_check_constraint
from outbox.types import JSONType, UtcDateTime, db_now

metadata = sa.MetaData(
    naming_convention={
        "ix": "ix_%(table_name)s_%(column_0_N_name)s",
        "uq": "uq_%(table_name)s_%(column_0_N_name)s",
        "ck": "ck_%(table_name)s_%(constraint_name)s",
        "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
        "pk": "pk_%(table_name)s",
    }
)

# SQLite only aliases the rowid for INTEGER PRIMARY KEY; PostgreSQL gets bigint identity.
Id = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def _created() -> sa.Column[object]:
    return sa.Column("created_at", UtcDateTime(), nullable=False, server_default=db_now())


def _updated() -> sa.Column[object]:
    return sa.Column("updated_at", UtcDateTime(), nullable=False, server_default=db_now())


tasks = sa.Table(
    "outbox_tasks",
    metadata,
    sa.Column("id", Id, primary_key=True, autoincrement=True),
    sa.Column("tenant_id", sa.Text(), nullable=False),
    sa.Column("task_id", sa.Text(), nullable=False),
    sa.Column("workflow_version", sa.Text()),
    sa.Column("state_revision", sa.BigInteger(), nullable=False, server_default="0"),
    sa.Column("phase", sa.Text()),
    sa.Column("state", JSONType),
    sa.Column("cancelled_at", UtcDateTime()),
    sa.Column("cancel_reason", sa.Text()),
    sa.Column("deadline_at", UtcDateTime()),
    sa.Column("max_attempts", sa.Integer()),  # budget: total attempts across the task
    sa.Column("max_elapsed_seconds", sa.Float()),
    sa.Column("legal_hold_owner", sa.Text()),
    sa.Column("legal_hold_review_at", UtcDateTime()),
    _created(),
    _updated(),
    sa.UniqueConstraint("tenant_id", "task_id"),
    sa.CheckConstraint("state_revision >= 0", name="revision_nonnegative"),
)

operations = sa.Table(
    "outbox_operations",
    metadata,
    sa.Column("id", Id, primary_key=True, autoincrement=True),
    sa.Column("tenant_id", sa.Text(), nullable=False),
    sa.Column("task_id", sa.Text(), nullable=False),
    sa.Column("operation_id", sa.Text(), nullable=False),
    sa.Column("provider", sa.Text(), nullable=False),
    sa.Column("payload", JSONType),
    sa.Column("payload_ref", sa.Text()),
    sa.Column("payload_digest", sa.Text()),
    sa.Column("idempotency_key", sa.Text()),
    sa.Column("requires_approval", sa.Boolean(), nullable=False, server_default=sa.false()),
    sa.Column("deadline_at", UtcDateTime()),
    sa.Column("ordering_key", sa.Text()),
    sa.Column("max_attempts", sa.Integer()),
    sa.Column("max_elapsed_seconds", sa.Float()),
    sa.Column("workflow_version", sa.Text()),
    sa.Column("payload_schema", sa.Integer()),
    sa.Column("traceparent", sa.Text()),
    # --- owned by the dispatcher ---
    sa.Column(
        "status", sa.Text(), nullable=False, server_default=OperationStatus.PENDING.value
    ),
    sa.Column("fencing_token", sa.BigInteger()),
    sa.Column("lease_owner", sa.Text()),
    sa.Column("lease_expires_at", UtcDateTime()),
    sa.Column("attempts", sa.Integer(), nullable=False, server_default="0"),
    sa.Column("first_dispatched_at", UtcDateTime()),
    sa.Column("last_attempt_started_at", UtcDateTime()),
    sa.Column("last_outcome", sa.Text()),
    sa.Column("next_attempt_at", UtcDateTime()),
    sa.Column("receipt", JSONType),
    sa.Column("status_reason", sa.Text()),
    sa.Column("state_revision", sa.BigInteger(), nullable=False, server_default="0"),
    _created(),
    _updated(),
    # --- set by the retention path (migration 0002; see outbox.retention) ---
    sa.Column("payload_purged_at", UtcDateTime()),  # payload is then the JSON value null
    sa.Column("receipt_purged_at", UtcDateTime()),
    sa.UniqueConstraint("tenant_id", "operation_id"),
    sa.UniqueConstraint("tenant_id", "provider", "idempotency_key"),
    sa.CheckConstraint(sql_check_constraint("status"), name="status_valid"),
    sa.CheckConstraint(
        "payload IS NOT NULL OR payload_ref IS NOT NULL", name="payload_or_ref"
    ),
    sa.CheckConstraint(
        "status NOT IN ('claimed', 'dispatching') OR "
        "(lease_expires_at IS NOT NULL AND fencing_token IS NOT NULL)",
        name="leased_has_lease",
    ),
    sa.CheckConstraint("attempts >= 0", name="attempts_nonnegative"),
)

# Claim scan: eligible pending rows in insertion order (partial on both dialects).
sa.Index(
    "ix_outbox_operations_pending_due",
    operations.c.next_attempt_at,
    operations.c.id,
    postgresql_where=operations.c.status == "pending",
    sqlite_where=operations.c.status == "pending",
)
# Claim order: pending rows by id, so a claim walks the index in insertion order and stops
# after one batch (filtering rows whose next_attempt_at is still ahead), whatever the backlog.
sa.Index(
    "ix_outbox_operations_pending_id",
    operations.c.id,
    postgresql_where=operations.c.status == "pending",
    sqlite_where=operations.c.status == "pending",
)
# Lease recovery: leased rows by expiry.
sa.Index(
    "ix_outbox_operations_leased_expiry",
    operations.c.lease_expires_at,
    postgresql_where=operations.c.status.in_(["claimed", "dispatching"]),
    sqlite_where=operations.c.status.in_(["claimed", "dispatching"]),
)
# Rows at rest by status and age (gauges, retention): not the rows on the dispatch path,
# which the partial pending and lease indexes hold, so a dispatch's three status changes
# add one entry here, not three (migration 0004).
ON_THE_PATH = ("pending", "claimed", "dispatching")


def at_rest() -> sa.ColumnElement[bool]:
    """The status index's predicate. A query of rows at rest states it besides its own
    status test, so SQLite (which proves a partial index usable only from a term it finds
    as written) reads the index too; PostgreSQL proves it from ``status = ...`` alone."""
    return operations.c.status.notin_(ON_THE_PATH)


sa.Index(
    "ix_outbox_operations_status_updated",
    operations.c.status,
    operations.c.updated_at,
    postgresql_where=at_rest(),
    sqlite_where=at_rest(),
)
# Rows by task; the id last gives each row a key of its own (migration 0007): under
# (tenant_id, task_id) alone a task's rows and every version of them shared one key, a
# long run of duplicates rewritten on each of a dispatch's (never HOT) updates.
sa.Index(
    "ix_outbox_operations_task", operations.c.tenant_id, operations.c.task_id, operations.c.id
)
sa.Index(
    "ix_outbox_operations_ordering",
    operations.c.ordering_key,
    operations.c.id,
    postgresql_where=operations.c.ordering_key.isnot(None),
    sqlite_where=operations.c.ordering_key.isnot(None),
)

approvals = sa.Table(
    "outbox_approvals",
    metadata,
    sa.Column("id", Id, primary_key=True, autoincrement=True),
    sa.Column("tenant_id", sa.Text(), nullable=False),
    sa.Column("operation_id", sa.Text(), nullable=False),
    sa.Column("payload_hash", sa.Text(), nullable=False),
    sa.Column("approved_by", sa.Text(), nullable=False),
    sa.Column("reason", sa.Text()),
    sa.Column("approved_at", UtcDateTime(), nullable=False, server_default=db_now()),
    sa.Column("expires_at", UtcDateTime()),
    sa.Column("revoked_at", UtcDateTime()),
    sa.Column("revoked_by", sa.Text()),
    sa.Column("consumed_at", UtcDateTime()),
    sa.Column("consumed_fencing_token", sa.BigInteger()),
    _created(),
)
sa.Index("ix_outbox_approvals_operation", approvals.c.tenant_id, approvals.c.operation_id)

attempts = sa.Table(
    "outbox_attempts",
    metadata,
    sa.Column("id", Id, primary_key=True, autoincrement=True),
    sa.Column("tenant_id", sa.Text(), nullable=False),
    sa.Column("operation_id", sa.Text(), nullable=False),
    sa.Column("attempt", sa.Integer(), nullable=False),
    sa.Column("fencing_token", sa.BigInteger()),
    sa.Column("worker", sa.Text()),
    sa.Column("provider", sa.Text()),
    sa.Column("started_at", UtcDateTime()),
    sa.Column("finished_at", UtcDateTime()),
    sa.Column("result_class", sa.Text(), nullable=False),
    sa.Column("status_code", sa.Integer()),
    sa.Column("error_class", sa.Text()),
    sa.Column("transport_phase", sa.Text()),
    sa.Column("request_digest", sa.Text()),
    sa.Column("duration_ms", sa.Float()),
    sa.Column("evidence", JSONType),
    sa.Column("evidence_ref", sa.Text()),
    _created(),
)
sa.Index("ix_outbox_attempts_operation", attempts.c.tenant_id, attempts.c.operation_id)
# append-only, in time order: a block-range index on PostgreSQL (migration 0005)
sa.Index("ix_outbox_attempts_created", attempts.c.created_at, postgresql_using="brin")

events = sa.Table(
    "outbox_events",
    metadata,
    sa.Column("id", Id, primary_key=True, autoincrement=True),
    sa.Column("tenant_id", sa.Text(), nullable=False),
    sa.Column("task_id", sa.Text()),
    sa.Column("operation_id", sa.Text()),
    sa.Column("kind", sa.Text(), nullable=False),  # transition, override, cancel_too_late, ...
    sa.Column("from_status", sa.Text()),
    sa.Column("to_status", sa.Text()),
    sa.Column("actor", sa.Text(), nullable=False),
    sa.Column("reason", sa.Text()),
    sa.Column("evidence_ref", sa.Text()),
    sa.Column("detail", JSONType),
    sa.Column("fencing_token", sa.BigInteger()),
    _created(),
)
sa.Index("ix_outbox_events_operation", events.c.tenant_id, events.c.operation_id)
sa.Index("ix_outbox_events_created", events.c.created_at, postgresql_using="brin")

meta = sa.Table(
    "outbox_meta",
    metadata,
    sa.Column("tenant_id", sa.Text(), nullable=False, server_default="*"),
    sa.Column("name", sa.Text(), nullable=False),
    sa.Column("value", sa.Text(), nullable=False),
    sa.PrimaryKeyConstraint("tenant_id", "name"),
)
"""Settings the database itself enforces (``max_payload_bytes``) and, on SQLite, the
fencing counter (``fencing``). PostgreSQL uses the sequence ``outbox_fencing_seq``."""

FENCING_SEQUENCE = "outbox_fencing_seq"
