"""security and retention: roles, row-level security, column grants, the purge path

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-03 10:00:00.000000

Both dialects: ``payload_purged_at`` / ``receipt_purged_at`` on ``outbox_operations``; the
immutability and append-only rules let the retention path (and only it) replace an
operation's payload with the JSON value ``null`` (so the 0001 CHECK still holds) and null
the free-form ``detail`` / ``evidence`` of events and attempts. PostgreSQL only: NOLOGIN roles (names
from the Alembic config attributes ``agent_role`` ... or ``OUTBOXD_DATABASE_*_ROLE``),
table and column grants, RLS enabled and FORCED on every outbox table with the tenant
taken from the transaction-local ``outbox.tenant_id``, and the audited
``outbox_reveal_payload`` function. See docs/security-model.md.
"""

from __future__ import annotations

import os
import re

import sqlalchemy as sa
from alembic import op

from outbox.migrations import rules_0001 as ddl
from outbox.types import UtcDateTime

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

OPS = "outbox_operations"
TABLES = ("outbox_tasks", OPS, "outbox_approvals", "outbox_attempts", "outbox_events",
          "outbox_meta")
SERIAL = ("outbox_tasks", OPS, "outbox_approvals", "outbox_attempts", "outbox_events")
ROLE_DEFAULTS = {"agent": "outbox_agent", "dispatcher": "outbox_dispatcher",
                 "operator": "outbox_operator", "retention": "outbox_retention"}
TENANT = "current_setting('outbox.tenant_id', true)"
PURGE_FLAG_PG = "COALESCE(current_setting('outbox.retention_purge', true), '') = 'on'"
PURGE_FLAG_SQLITE = ("EXISTS (SELECT 1 FROM outbox_meta WHERE tenant_id = '*' "
                     "AND name = 'retention_purge' AND value = '1')")
FENCING = "outbox_fencing_seq"

# Columns each role may UPDATE on outbox_operations (column-level grants).
DISPATCHER_OPS = ("status", "fencing_token", "lease_owner", "lease_expires_at", "attempts",
                  "first_dispatched_at", "last_attempt_started_at", "last_outcome",
                  "next_attempt_at", "receipt", "status_reason", "state_revision",
                  "updated_at", "payload_digest", "idempotency_key")
AGENT_CANCEL_OPS = ("status", "status_reason", "state_revision", "updated_at", "lease_owner",
                    "lease_expires_at")
OPERATOR_OPS = (*AGENT_CANCEL_OPS, "next_attempt_at", "last_outcome")
RETENTION_OPS = ("payload", "receipt", "payload_purged_at", "receipt_purged_at",
                 "payload_digest", "status", "status_reason", "state_revision", "updated_at")
AGENT_TASKS = ("workflow_version", "state_revision", "phase", "state", "cancelled_at",
               "cancel_reason", "deadline_at", "max_attempts", "max_elapsed_seconds",
               "updated_at")
# Everything but the bodies: what operators and monitoring may read (columns as of 0002).
BODIES = {OPS: ("payload", "receipt"), "outbox_attempts": ("evidence",),
          "outbox_tasks": ("state",)}
# Evidence columns that stay fixed when the retention path minimises events / attempts.
EVENT_KEEP = ("id", "tenant_id", "task_id", "operation_id", "kind", "from_status",
              "to_status", "actor", "reason", "evidence_ref", "fencing_token", "created_at")
ATTEMPT_KEEP = ("id", "tenant_id", "operation_id", "attempt", "fencing_token", "worker",
                "provider", "started_at", "finished_at", "result_class", "status_code",
                "error_class", "transport_phase", "request_digest", "duration_ms",
                "evidence_ref", "created_at")
COLUMNS = {
    OPS: ("id", "tenant_id", "task_id", "operation_id", "provider", "payload", "payload_ref",
          "payload_digest", "idempotency_key", "requires_approval", "deadline_at",
          "ordering_key", "max_attempts", "max_elapsed_seconds", "workflow_version",
          "payload_schema", "traceparent", "status", "fencing_token", "lease_owner",
          "lease_expires_at", "attempts", "first_dispatched_at", "last_attempt_started_at",
          "last_outcome", "next_attempt_at", "receipt", "status_reason", "state_revision",
          "created_at", "updated_at", "payload_purged_at", "receipt_purged_at"),
    "outbox_tasks": ("id", "tenant_id", "task_id", "workflow_version", "state_revision",
                     "phase", "state", "cancelled_at", "cancel_reason", "deadline_at",
                     "max_attempts", "max_elapsed_seconds", "legal_hold_owner",
                     "legal_hold_review_at", "created_at", "updated_at"),
    "outbox_attempts": (*ATTEMPT_KEEP, "evidence"),
}


# -- helpers -------------------------------------------------------------------------------

def _attr(name: str) -> object:
    config = op.get_context().config
    return config.attributes.get(name) if config is not None else None


def _schema() -> str | None:
    schema = _attr("schema")
    return schema if isinstance(schema, str) else None


def _roles() -> dict[str, str]:
    roles: dict[str, str] = {}
    for kind, default in ROLE_DEFAULTS.items():
        value = _attr(f"{kind}_role") or os.environ.get(f"OUTBOXD_DATABASE_{kind.upper()}_ROLE")
        name = value if isinstance(value, str) and value else default
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]{0,62}", name):
            raise ValueError(f"{kind}_role must be an SQL identifier")
        roles[kind] = f'"{name}"'
    return roles


def _q(name: str) -> str:
    schema = _schema()
    return f'"{schema}".{name}' if schema else name


def _cols(names: tuple[str, ...] | list[str]) -> str:
    return ", ".join(names)


def _dialect() -> str:
    return str(op.get_bind().dialect.name)


# -- upgrade -------------------------------------------------------------------------------

def upgrade() -> None:
    schema = _schema()
    for name in ("payload_purged_at", "receipt_purged_at"):
        op.add_column(OPS, sa.Column(name, UtcDateTime(), nullable=True), schema=schema)
    if _dialect() == "sqlite":
        for stmt in _sqlite_purge_rules():
            op.execute(stmt)
        return
    for stmt in [*_pg_purge_rules(), *_pg_roles(), *_pg_grants(), *_pg_policies(),
                 *_pg_reveal()]:
        op.execute(stmt)
    op.execute(f"DROP TRIGGER IF EXISTS outbox_operations_immutable ON {_q(OPS)}")
    op.execute(
        f"CREATE TRIGGER outbox_operations_immutable BEFORE UPDATE OF "
        f"{ddl.IMMUTABLE_COLUMNS}, payload_purged_at ON {_q(OPS)} "
        f"FOR EACH ROW EXECUTE FUNCTION {_q('outbox_operations_immutable')}()"
    )


def _sqlite_purge_rules() -> list[str]:
    immutable = f"""
        CREATE TRIGGER outbox_operations_immutable
        BEFORE UPDATE OF {ddl.IMMUTABLE_COLUMNS}, payload_purged_at ON outbox_operations
        WHEN NEW.tenant_id IS NOT OLD.tenant_id OR NEW.operation_id IS NOT OLD.operation_id
          OR NEW.task_id IS NOT OLD.task_id OR NEW.provider IS NOT OLD.provider
          OR (NEW.payload IS NOT OLD.payload AND NOT (NEW.payload = 'null'
              AND NEW.payload_purged_at IS NOT NULL AND {PURGE_FLAG_SQLITE}))
          OR NEW.payload_ref IS NOT OLD.payload_ref
          OR (OLD.payload_purged_at IS NOT NULL
              AND NEW.payload_purged_at IS NOT OLD.payload_purged_at)
          OR (OLD.payload_digest IS NOT NULL AND NEW.payload_digest IS NOT OLD.payload_digest)
          OR (OLD.idempotency_key IS NOT NULL AND NEW.idempotency_key IS NOT OLD.idempotency_key)
        BEGIN
          SELECT RAISE(ABORT, 'outbox: immutable column of outbox_operations changed');
        END
        """
    stmts = ["DROP TRIGGER IF EXISTS outbox_operations_immutable", immutable]
    for table, body, keep in (("outbox_events", "detail", EVENT_KEEP),
                              ("outbox_attempts", "evidence", ATTEMPT_KEEP)):
        same = " AND ".join(f"NEW.{c} IS OLD.{c}" for c in keep)
        stmts += [
            f"DROP TRIGGER IF EXISTS {table}_append_only_update",
            f"""
            CREATE TRIGGER {table}_append_only_update BEFORE UPDATE ON {table}
            WHEN NOT ({PURGE_FLAG_SQLITE} AND NEW.{body} IS NULL AND {same})
            BEGIN
              SELECT RAISE(ABORT, 'outbox: {table} is append-only');
            END
            """,
        ]
    return stmts


def _pg_purge_rules() -> list[str]:
    return [
        f"""
        CREATE OR REPLACE FUNCTION {_q('outbox_operations_immutable')}() RETURNS trigger
        LANGUAGE plpgsql AS $$
        DECLARE payload_ok boolean;
        BEGIN
          payload_ok := NEW.payload IS NOT DISTINCT FROM OLD.payload
            OR (NEW.payload = 'null'::jsonb AND NEW.payload_purged_at IS NOT NULL
                AND {PURGE_FLAG_PG});
          IF NEW.tenant_id IS DISTINCT FROM OLD.tenant_id
             OR NEW.operation_id IS DISTINCT FROM OLD.operation_id
             OR NEW.task_id IS DISTINCT FROM OLD.task_id
             OR NEW.provider IS DISTINCT FROM OLD.provider
             OR NOT payload_ok
             OR NEW.payload_ref IS DISTINCT FROM OLD.payload_ref
             OR (OLD.payload_purged_at IS NOT NULL
                 AND NEW.payload_purged_at IS DISTINCT FROM OLD.payload_purged_at)
             OR (OLD.payload_digest IS NOT NULL
                 AND NEW.payload_digest IS DISTINCT FROM OLD.payload_digest)
             OR (OLD.idempotency_key IS NOT NULL
                 AND NEW.idempotency_key IS DISTINCT FROM OLD.idempotency_key) THEN
            RAISE EXCEPTION 'outbox: immutable column of outbox_operations changed'
              USING ERRCODE = 'integrity_constraint_violation';
          END IF;
          RETURN NEW;
        END $$
        """,
        f"""
        CREATE OR REPLACE FUNCTION {_q('outbox_append_only')}() RETURNS trigger
        LANGUAGE plpgsql AS $$
        BEGIN
          IF {PURGE_FLAG_PG} THEN
            IF TG_OP = 'DELETE' THEN
              RETURN OLD;
            END IF;
            IF TG_OP = 'UPDATE' THEN
              IF (to_jsonb(NEW) - 'detail' - 'evidence') = (to_jsonb(OLD) - 'detail' - 'evidence')
                 AND COALESCE(to_jsonb(NEW) -> 'detail', 'null'::jsonb) = 'null'::jsonb
                 AND COALESCE(to_jsonb(NEW) -> 'evidence', 'null'::jsonb) = 'null'::jsonb THEN
                RETURN NEW;
              END IF;
            END IF;
          END IF;
          RAISE EXCEPTION 'outbox: % is append-only', TG_TABLE_NAME
            USING ERRCODE = 'integrity_constraint_violation';
        END $$
        """,
    ]


def _pg_roles() -> list[str]:
    stmts = []
    for name in _roles().values():
        stmts.append(
            "DO $$ BEGIN CREATE ROLE " + name + " NOLOGIN; "
            "EXCEPTION WHEN duplicate_object OR unique_violation THEN NULL; END $$"
        )
    schema = _schema()
    if schema:
        stmts.append(f'GRANT USAGE ON SCHEMA "{schema}" TO {_cols(list(_roles().values()))}')
    return stmts


def _pg_grants() -> list[str]:
    r = _roles()
    agent, disp, oper, ret = r["agent"], r["dispatcher"], r["operator"], r["retention"]
    t = {name: _q(name) for name in TABLES}
    meta_cols = {name: [c for c in COLUMNS[name] if c not in body]
                 for name, body in BODIES.items()}
    seq = {name: _q(f"{name}_id_seq") for name in SERIAL}
    everyone = _cols(list(r.values()))
    return [
        # every role: the schema revision (the daemon and readiness check it)
        f"GRANT SELECT ON {_q('alembic_version')} TO {everyone}",
        # agent: its tenant's tasks and operations; cancel; read its own rows
        f"GRANT SELECT, INSERT ON {t['outbox_tasks']}, {t[OPS]} TO {agent}",
        f"GRANT UPDATE ({_cols(AGENT_TASKS)}) ON {t['outbox_tasks']} TO {agent}",
        f"GRANT UPDATE ({_cols(AGENT_CANCEL_OPS)}) ON {t[OPS]} TO {agent}",
        f"GRANT SELECT, INSERT ON {t['outbox_events']} TO {agent}",
        f"GRANT SELECT ON {t['outbox_attempts']}, {t['outbox_approvals']}, "
        f"{t['outbox_meta']} TO {agent}",
        f"GRANT USAGE ON SEQUENCE {seq['outbox_tasks']}, {seq[OPS]}, {seq['outbox_events']} "
        f"TO {agent}",
        # dispatcher: read everything, write only what it owns, append the records
        f"GRANT SELECT ON {_cols(list(t.values()))} TO {disp}",
        f"GRANT UPDATE ({_cols(DISPATCHER_OPS)}) ON {t[OPS]} TO {disp}",
        # FOR UPDATE row locks (task budgets) need an UPDATE privilege on some column
        f"GRANT UPDATE (updated_at) ON {t['outbox_tasks']} TO {disp}",
        f"GRANT INSERT ON {t['outbox_attempts']}, {t['outbox_events']} TO {disp}",
        f"GRANT UPDATE (consumed_at, consumed_fencing_token) ON {t['outbox_approvals']} "
        f"TO {disp}",
        f"GRANT USAGE ON SEQUENCE {_q(FENCING)}, {seq['outbox_attempts']}, "
        f"{seq['outbox_events']} TO {disp}",
        # operator: metadata without bodies; audited overrides; approvals; legal holds
        f"GRANT SELECT ({_cols(meta_cols[OPS])}) ON {t[OPS]} TO {oper}",
        f"GRANT SELECT ({_cols(meta_cols['outbox_tasks'])}) ON {t['outbox_tasks']} TO {oper}",
        f"GRANT SELECT ({_cols(meta_cols['outbox_attempts'])}) ON {t['outbox_attempts']} "
        f"TO {oper}",
        f"GRANT SELECT ON {t['outbox_events']}, {t['outbox_approvals']}, {t['outbox_meta']} "
        f"TO {oper}",
        f"GRANT UPDATE ({_cols(OPERATOR_OPS)}) ON {t[OPS]} TO {oper}",
        f"GRANT UPDATE (legal_hold_owner, legal_hold_review_at, cancelled_at, cancel_reason, "
        f"updated_at) ON {t['outbox_tasks']} TO {oper}",
        f"GRANT INSERT ON {t['outbox_events']}, {t['outbox_approvals']} TO {oper}",
        f"GRANT UPDATE (revoked_at, revoked_by) ON {t['outbox_approvals']} TO {oper}",
        f"GRANT USAGE ON SEQUENCE {seq['outbox_events']}, {seq['outbox_approvals']} "
        f"TO {oper}",
        # retention: the purge path only
        f"GRANT SELECT ON {_cols(list(t.values()))} TO {ret}",
        f"GRANT UPDATE ({_cols(RETENTION_OPS)}) ON {t[OPS]} TO {ret}",
        f"GRANT UPDATE (state, cancel_reason, updated_at) ON {t['outbox_tasks']} TO {ret}",
        f"GRANT UPDATE (detail), INSERT, DELETE ON {t['outbox_events']} TO {ret}",
        f"GRANT UPDATE (evidence), DELETE ON {t['outbox_attempts']} TO {ret}",
        f"GRANT UPDATE (reason), DELETE ON {t['outbox_approvals']} TO {ret}",
        f"GRANT USAGE ON SEQUENCE {seq['outbox_events']} TO {ret}",
    ]


def _pg_policies() -> list[str]:
    r = _roles()
    stmts = []
    for name in TABLES:
        table = _q(name)
        own = (f"tenant_id IN ('*', {TENANT})" if name == "outbox_meta"
               else f"tenant_id = {TENANT}")
        stmts += [
            f"ALTER TABLE {table} ENABLE ROW LEVEL SECURITY",
            f"ALTER TABLE {table} FORCE ROW LEVEL SECURITY",
            f"CREATE POLICY outbox_owner ON {table} TO CURRENT_USER USING (true) "
            "WITH CHECK (true)",
            f"CREATE POLICY outbox_cross_tenant ON {table} TO {r['dispatcher']}, "
            f"{r['retention']} USING (true) WITH CHECK (true)",
            f"CREATE POLICY outbox_tenant ON {table} TO {r['agent']}, {r['operator']} "
            f"USING ({own}) WITH CHECK ({own})",
        ]
    # The agent's only change to an operation: cancel a pending or blocked one.
    stmts.append(
        f"CREATE POLICY outbox_agent_cancel_only ON {_q(OPS)} AS RESTRICTIVE FOR UPDATE "
        f"TO {r['agent']} USING (status IN ('pending', 'blocked')) "
        # cancelled, or unknown when an earlier attempt may have landed (reconciled, not sent)
        "WITH CHECK (status IN ('cancelled', 'unknown'))"
    )
    return stmts


def _pg_reveal() -> list[str]:
    fn = _q("outbox_reveal_payload")
    path = f'"{_schema()}", pg_temp' if _schema() else "public, pg_temp"
    return [
        f"""
        CREATE OR REPLACE FUNCTION {fn}(p_tenant text, p_operation text, p_actor text,
                                         p_reason text)
        RETURNS jsonb LANGUAGE plpgsql SECURITY DEFINER SET search_path = {path} AS $$
        DECLARE body jsonb; tid text;
        BEGIN
          IF p_tenant IS DISTINCT FROM {TENANT} THEN
            RAISE EXCEPTION 'outbox: reveal_payload outside the transaction''s tenant'
              USING ERRCODE = 'insufficient_privilege';
          END IF;
          IF COALESCE(btrim(p_actor), '') = '' OR COALESCE(btrim(p_reason), '') = '' THEN
            RAISE EXCEPTION 'outbox: reveal_payload needs an actor and a reason'
              USING ERRCODE = 'invalid_parameter_value';
          END IF;
          SELECT payload, task_id INTO body, tid FROM outbox_operations
            WHERE tenant_id = p_tenant AND operation_id = p_operation;
          IF NOT FOUND THEN
            RAISE EXCEPTION 'outbox: operation not found' USING ERRCODE = 'no_data_found';
          END IF;
          INSERT INTO outbox_events (tenant_id, task_id, operation_id, kind, actor, reason,
                                     detail)
            VALUES (p_tenant, tid, p_operation, 'payload_revealed', p_actor, p_reason,
                    jsonb_build_object('db_user', session_user));
          RETURN body;
        END $$
        """,
        f"REVOKE ALL ON FUNCTION {fn}(text, text, text, text) FROM PUBLIC",
        f"GRANT EXECUTE ON FUNCTION {fn}(text, text, text, text) TO {_roles()['operator']}",
    ]


# -- downgrade -----------------------------------------------------------------------------

def downgrade() -> None:
    schema = _schema()
    if _dialect() == "sqlite":
        replaced = ("outbox_operations_immutable", "outbox_events_append_only_update",
                    "outbox_attempts_append_only_update")
        for name in replaced:
            op.execute(f"DROP TRIGGER IF EXISTS {name}")
        _drop_columns(schema)
        for stmt in ddl.sqlite_statements():
            if any(f"CREATE TRIGGER {name} " in stmt for name in replaced):
                op.execute(stmt)
        return
    r = _roles()
    everyone = _cols(list(r.values()))
    op.execute(f"DROP FUNCTION IF EXISTS {_q('outbox_reveal_payload')}(text, text, text, text)")
    for name in TABLES:
        table = _q(name)
        for policy in ("outbox_owner", "outbox_cross_tenant", "outbox_tenant",
                       "outbox_agent_cancel_only"):
            op.execute(f"DROP POLICY IF EXISTS {policy} ON {table}")
        op.execute(f"ALTER TABLE {table} NO FORCE ROW LEVEL SECURITY")
        op.execute(f"ALTER TABLE {table} DISABLE ROW LEVEL SECURITY")
        op.execute(f"REVOKE ALL ON {table} FROM {everyone}")
    op.execute(f"REVOKE ALL ON {_q('alembic_version')} FROM {everyone}")
    sequences = [_q(f"{n}_id_seq") for n in SERIAL] + [_q(FENCING)]
    op.execute(f"REVOKE ALL ON SEQUENCE {_cols(sequences)} FROM {everyone}")
    if schema:
        op.execute(f'REVOKE USAGE ON SCHEMA "{schema}" FROM {everyone}')
    # The roles stay: they are cluster-wide and other databases may use them.
    op.execute(f"DROP TRIGGER IF EXISTS outbox_operations_immutable ON {_q(OPS)}")
    for stmt in ddl.postgresql_statements(schema):
        if ("CREATE OR REPLACE FUNCTION" in stmt and (
            "outbox_operations_immutable" in stmt or "outbox_append_only" in stmt
        )) or "CREATE TRIGGER outbox_operations_immutable" in stmt:
            op.execute(stmt)
    _drop_columns(schema)


def _drop_columns(schema: str | None) -> None:
    # A purged payload is the JSON value null, which the 0001 CHECK accepts: nothing to undo.
    for name in ("receipt_purged_at", "payload_purged_at"):
        op.drop_column(OPS, name, schema=schema)
