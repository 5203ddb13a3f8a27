"""payload shape: refuse at INSERT what the dispatcher could not decode

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-04 16:00:00.000000

A ``BEFORE INSERT`` trigger on ``outbox_operations``, beside the payload size limit, on
both dialects. It refuses (messages start with ``outbox:``, mapped to ``InvalidPayload``):

* a payload or receipt nested deeper than 64 levels (``outbox.decoding.MAX_JSON_DEPTH``);
  SQLite counts the levels of every path without a quoted key (a trigger cannot recurse;
  the dispatcher parks what gets past it, ``payload_undecodable``);
* a number outside the range of a double (an integer of thousands of digits included);
* a timestamp Python cannot hold: PostgreSQL ``infinity``, ``-infinity``, years before 1
  or after 9999; SQLite text that is not a ``YYYY-MM-DD...`` timestamp.

PostgreSQL's ``jsonb`` already refuses lone surrogate escapes and ``\\u0000``. Rows stored
before this revision are not checked; the dispatcher decodes each claimed row on its own
and parks what it cannot decode (``outbox.decoding``).
"""

from __future__ import annotations

from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

OPS = "outbox_operations"
DEPTH = 64  # outbox.decoding.MAX_JSON_DEPTH when this revision was written
DOUBLE_MAX = "1.7976931348623157e308"
JSON_COLUMNS = ("payload", "receipt")
TIME_COLUMNS = ("deadline_at", "next_attempt_at", "lease_expires_at", "first_dispatched_at",
                "last_attempt_started_at", "created_at", "updated_at")
TRIGGER = "outbox_operations_shape"


def _schema() -> str | None:
    config = op.get_context().config
    schema = config.attributes.get("schema") if config is not None else None
    return schema if isinstance(schema, str) else None


def _q(name: str) -> str:
    schema = _schema()
    return f'"{schema}".{name}' if schema else name


def upgrade() -> None:
    if op.get_bind().dialect.name == "sqlite":
        op.execute(_sqlite_trigger())
        return
    op.execute(_pg_function())
    op.execute(f"CREATE TRIGGER {TRIGGER} BEFORE INSERT ON {_q(OPS)} "
               f"FOR EACH ROW EXECUTE FUNCTION {_q(TRIGGER)}()")


def downgrade() -> None:
    if op.get_bind().dialect.name == "sqlite":
        op.execute(f"DROP TRIGGER IF EXISTS {TRIGGER}")
        return
    op.execute(f"DROP TRIGGER IF EXISTS {TRIGGER} ON {_q(OPS)}")
    op.execute(f"DROP FUNCTION IF EXISTS {_q(TRIGGER)}()")


def _sqlite_trigger() -> str:
    checks = []
    for col in JSON_COLUMNS:
        # a container at a path of DEPTH steps is nested DEPTH + 1 deep; paths with a quoted
        # key are not counted (a quoted key may hold '.' or '[')
        checks.append(f"""
          SELECT RAISE(ABORT, 'outbox: {col} is nested deeper than {DEPTH} levels')
            WHERE NEW.{col} IS NOT NULL AND json_valid(NEW.{col}) AND EXISTS (
              SELECT 1 FROM json_tree(NEW.{col})
               WHERE type IN ('object', 'array') AND instr(fullkey, '"') = 0
                 AND length(fullkey) - length(replace(replace(fullkey, '[', ''), '.', ''))
                     >= {DEPTH});
          SELECT RAISE(ABORT, 'outbox: {col} holds a number outside the range of a double')
            WHERE NEW.{col} IS NOT NULL AND json_valid(NEW.{col}) AND EXISTS (
              SELECT 1 FROM json_tree(NEW.{col})
               WHERE type IN ('integer', 'real') AND abs(atom) > {DOUBLE_MAX});""")
    for col in TIME_COLUMNS:
        checks.append(f"""
          SELECT RAISE(ABORT, 'outbox: {col} is not a timestamp (YYYY-MM-DD HH:MM:SS)')
            WHERE NEW.{col} IS NOT NULL AND (typeof(NEW.{col}) <> 'text'
              OR NEW.{col} NOT GLOB '[0-9][0-9][0-9][0-9]-[0-1][0-9]-[0-3][0-9]*'
              OR julianday(NEW.{col}) IS NULL);""")
    return (f"CREATE TRIGGER {TRIGGER} BEFORE INSERT ON {OPS}\nBEGIN"
            + "".join(checks) + "\nEND")


def _pg_function() -> str:
    checks = []
    for col in JSON_COLUMNS:
        checks.append(f"""
  IF NEW.{col} IS NOT NULL AND jsonb_path_exists(NEW.{col},
       'strict $.**{{{DEPTH}}} ? (@.type() == "object" || @.type() == "array")') THEN
    RAISE EXCEPTION 'outbox: {col} is nested deeper than {DEPTH} levels'
      USING ERRCODE = 'check_violation';
  END IF;
  IF NEW.{col} IS NOT NULL AND jsonb_path_exists(NEW.{col},
       'strict $.** ? (@.type() == "number" && (@ > {DOUBLE_MAX} || @ < -{DOUBLE_MAX}))') THEN
    RAISE EXCEPTION 'outbox: {col} holds a number outside the range of a double'
      USING ERRCODE = 'check_violation';
  END IF;""")
    for col in TIME_COLUMNS:
        checks.append(f"""
  IF NEW.{col} IS NOT NULL AND NOT (isfinite(NEW.{col})
       AND NEW.{col} >= '0001-01-01 00:00:00+00' AND NEW.{col} < '10000-01-01 00:00:00+00') THEN
    RAISE EXCEPTION 'outbox: {col} is not a timestamp Python can hold (years 1 to 9999)'
      USING ERRCODE = 'check_violation';
  END IF;""")
    return (f"CREATE OR REPLACE FUNCTION {_q(TRIGGER)}() RETURNS trigger\n"
            "LANGUAGE plpgsql AS $$\nBEGIN" + "".join(checks) + "\n  RETURN NEW;\nEND $$")
