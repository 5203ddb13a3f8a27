"""Database-side rules as migration 0001 installs them (and 0002 re-creates them after
rebuilding tables), one list of statements per dialect. Frozen with those revisions: a
revision must do tomorrow what it did the day it shipped, so nothing here changes; a new
rule is a new revision with its own statements. The live code's copies of the names it
shares with these rules are in :mod:`outbox.ddl` (a test checks they agree).

These hold even for agents that write rows with plain SQL:

* the default idempotency key ``tenant_id || ':' || operation_id`` (see
  :func:`outbox.digest.default_idempotency_key`), set once and never regenerated;
* identity, payload, digest and key columns of ``outbox_operations`` are immutable after
  insert (a digest or key may be filled once from NULL: the dispatcher's admission does it
  for plain-SQL rows);
* payload size limit (``outbox_meta`` row ``max_payload_bytes``, default 262144);
* ``outbox_events`` and ``outbox_attempts`` are append-only: UPDATE and DELETE are refused,
  except inside the retention job's own path (PostgreSQL: ``SET LOCAL
  outbox.retention_purge = 'on'``; SQLite: an ``outbox_meta`` flag row that exists only
  inside the purge transaction);
* PostgreSQL only: a statement-level ``NOTIFY outbox_operations`` on insert to wake
  dispatchers, and the fencing sequence.

Every message raised starts with ``outbox:`` so :mod:`outbox.db` can map it to our errors.
"""

from __future__ import annotations

DEFAULT_MAX_PAYLOAD_BYTES = 262_144
#: The immutability trigger fires only for UPDATEs that name one of these columns, so the
#: dispatcher's status writes (which never do) pay nothing for it.
IMMUTABLE_COLUMNS = (
    "tenant_id, task_id, operation_id, provider, payload, payload_ref, payload_digest, "
    "idempotency_key"
)
NOTIFY_CHANNEL = "outbox_operations"


def _q(schema: str | None, name: str) -> str:
    return f'"{schema}".{name}' if schema else name


def sqlite_statements() -> list[str]:
    return [
        f"""
        CREATE TRIGGER outbox_operations_admit BEFORE INSERT ON outbox_operations
        BEGIN
          SELECT RAISE(ABORT, 'outbox: payload is not valid JSON')
            WHERE NEW.payload IS NOT NULL AND NOT json_valid(NEW.payload);
          SELECT RAISE(ABORT, 'outbox: payload exceeds max_payload_bytes')
            WHERE NEW.payload IS NOT NULL AND length(CAST(NEW.payload AS BLOB)) > COALESCE(
              (SELECT CAST(value AS INTEGER) FROM outbox_meta
                WHERE tenant_id = '*' AND name = 'max_payload_bytes'),
              {DEFAULT_MAX_PAYLOAD_BYTES});
        END
        """,
        """
        CREATE TRIGGER outbox_operations_default_key AFTER INSERT ON outbox_operations
        WHEN NEW.idempotency_key IS NULL
        BEGIN
          UPDATE outbox_operations SET idempotency_key = NEW.tenant_id || ':' || NEW.operation_id
            WHERE id = NEW.id;
        END
        """,
        f"""
        CREATE TRIGGER outbox_operations_immutable BEFORE UPDATE OF {IMMUTABLE_COLUMNS}
        ON outbox_operations
        WHEN NEW.tenant_id IS NOT OLD.tenant_id OR NEW.operation_id IS NOT OLD.operation_id
          OR NEW.task_id IS NOT OLD.task_id OR NEW.provider IS NOT OLD.provider
          OR NEW.payload IS NOT OLD.payload OR NEW.payload_ref IS NOT OLD.payload_ref
          OR (OLD.payload_digest IS NOT NULL AND NEW.payload_digest IS NOT OLD.payload_digest)
          OR (OLD.idempotency_key IS NOT NULL AND NEW.idempotency_key IS NOT OLD.idempotency_key)
        BEGIN
          SELECT RAISE(ABORT, 'outbox: immutable column of outbox_operations changed');
        END
        """,
        *[
            f"""
            CREATE TRIGGER {table}_append_only_{verb.lower()} BEFORE {verb} ON {table}
            WHEN NOT EXISTS (SELECT 1 FROM outbox_meta
                             WHERE tenant_id = '*' AND name = 'retention_purge' AND value = '1')
            BEGIN
              SELECT RAISE(ABORT, 'outbox: {table} is append-only');
            END
            """
            for table in ("outbox_events", "outbox_attempts")
            for verb in ("UPDATE", "DELETE")
        ],
        "INSERT OR IGNORE INTO outbox_meta (tenant_id, name, value) VALUES ('*', 'fencing', '0')",
        f"INSERT OR IGNORE INTO outbox_meta (tenant_id, name, value) "
        f"VALUES ('*', 'max_payload_bytes', '{DEFAULT_MAX_PAYLOAD_BYTES}')",
    ]


def sqlite_drop_statements() -> list[str]:
    names = [
        "outbox_operations_admit",
        "outbox_operations_default_key",
        "outbox_operations_immutable",
        *[
            f"{t}_append_only_{v}"
            for t in ("outbox_events", "outbox_attempts")
            for v in ("update", "delete")
        ],
    ]
    return [f"DROP TRIGGER IF EXISTS {n}" for n in names]


def postgresql_statements(schema: str | None = None) -> list[str]:
    ops, meta = _q(schema, "outbox_operations"), _q(schema, "outbox_meta")

    def fn(name: str) -> str:
        return _q(schema, name)

    stmts = [
        f"CREATE SEQUENCE IF NOT EXISTS {_q(schema, 'outbox_fencing_seq')}",
        f"""
        CREATE OR REPLACE FUNCTION {fn("outbox_operations_admit")}() RETURNS trigger
        LANGUAGE plpgsql AS $$
        DECLARE lim bigint;
        BEGIN
          IF NEW.idempotency_key IS NULL THEN
            NEW.idempotency_key := NEW.tenant_id || ':' || NEW.operation_id;
          END IF;
          IF NEW.payload IS NOT NULL THEN
            SELECT value::bigint INTO lim FROM {meta}
              WHERE tenant_id = '*' AND name = 'max_payload_bytes';
            IF octet_length(NEW.payload::text) > COALESCE(lim, {DEFAULT_MAX_PAYLOAD_BYTES}) THEN
              RAISE EXCEPTION 'outbox: payload exceeds max_payload_bytes'
                USING ERRCODE = 'check_violation';
            END IF;
          END IF;
          RETURN NEW;
        END $$
        """,
        f"""
        CREATE TRIGGER outbox_operations_admit BEFORE INSERT ON {ops}
        FOR EACH ROW EXECUTE FUNCTION {fn("outbox_operations_admit")}()
        """,
        f"""
        CREATE OR REPLACE FUNCTION {fn("outbox_operations_immutable")}() RETURNS trigger
        LANGUAGE plpgsql AS $$
        BEGIN
          IF NEW.tenant_id IS DISTINCT FROM OLD.tenant_id
             OR NEW.operation_id IS DISTINCT FROM OLD.operation_id
             OR NEW.task_id IS DISTINCT FROM OLD.task_id
             OR NEW.provider IS DISTINCT FROM OLD.provider
             OR NEW.payload IS DISTINCT FROM OLD.payload
             OR NEW.payload_ref IS DISTINCT FROM OLD.payload_ref
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
        CREATE TRIGGER outbox_operations_immutable BEFORE UPDATE OF {IMMUTABLE_COLUMNS} ON {ops}
        FOR EACH ROW EXECUTE FUNCTION {fn("outbox_operations_immutable")}()
        """,
        f"""
        CREATE OR REPLACE FUNCTION {fn("outbox_append_only")}() RETURNS trigger
        LANGUAGE plpgsql AS $$
        BEGIN
          IF COALESCE(current_setting('outbox.retention_purge', true), '') = 'on'
             AND TG_OP = 'DELETE' THEN
            RETURN OLD;
          END IF;
          RAISE EXCEPTION 'outbox: % is append-only', TG_TABLE_NAME
            USING ERRCODE = 'integrity_constraint_violation';
        END $$
        """,
        f"""
        CREATE OR REPLACE FUNCTION {fn("outbox_notify")}() RETURNS trigger
        LANGUAGE plpgsql AS $$
        BEGIN
          PERFORM pg_notify('{NOTIFY_CHANNEL}', '');
          RETURN NULL;
        END $$
        """,
        f"""
        CREATE TRIGGER outbox_operations_notify AFTER INSERT ON {ops}
        FOR EACH STATEMENT EXECUTE FUNCTION {fn("outbox_notify")}()
        """,
        f"INSERT INTO {meta} (tenant_id, name, value) VALUES ('*', 'max_payload_bytes', "
        f"'{DEFAULT_MAX_PAYLOAD_BYTES}') ON CONFLICT DO NOTHING",
    ]
    for table in ("outbox_events", "outbox_attempts"):
        stmts.append(
            f"CREATE TRIGGER {table}_append_only BEFORE UPDATE OR DELETE ON {_q(schema, table)} "
            f"FOR EACH ROW EXECUTE FUNCTION {fn('outbox_append_only')}()"
        )
        stmts.append(
            f"CREATE TRIGGER {table}_no_truncate BEFORE TRUNCATE ON {_q(schema, table)} "
            f"FOR EACH STATEMENT EXECUTE FUNCTION {fn('outbox_append_only')}()"
        )
    return stmts


def postgresql_drop_statements(schema: str | None = None) -> list[str]:
    fns = [
        "outbox_operations_admit",
        "outbox_operations_immutable",
        "outbox_append_only",
        "outbox_notify",
    ]
    return [f"DROP FUNCTION IF EXISTS {_q(schema, f)}() CASCADE" for f in fns] + [
        f"DROP SEQUENCE IF EXISTS {_q(schema, 'outbox_fencing_seq')}"
    ]
