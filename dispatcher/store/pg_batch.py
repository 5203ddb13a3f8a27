"""The PostgreSQL form of the three hot-path statements: each protocol step is ONE
statement that moves a batch of rows and writes their ``outbox_events`` (and, for the
record step, ``outbox_attempts``) rows with data-modifying CTEs over the rows it moved.

Each statement is built once and bound with parameters; a batch's per-row values travel
as one JSON parameter read back with ``jsonb_to_recordset``, so the statement text is the
same whatever the batch size, SQLAlchemy compiles it once, and no row crosses the wire as
a statement of its own. The portable forms (and SQLite's) are in :mod:`dispatcher.store.queries`,
which calls these; the invariants are documented there.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql as pg
from sqlalchemy.sql.type_api import TypeEngine

from outbox import schema
from outbox.records import OPERATION_FIELDS, raw_operation_columns
from outbox.states import OperationStatus, checked_move
from outbox.types import db_now

ops = schema.operations
tasks = schema.tasks
S = OperationStatus

TOKEN = sa.bindparam("token", type_=sa.BigInteger())
ACTOR = sa.bindparam("actor", type_=sa.Text())
LEASE = sa.bindparam("lease", type_=sa.Float())
FENCED = {"fenced": True}

ATTEMPT_COLUMNS: tuple[tuple[str, TypeEngine[Any]], ...] = (
    ("tenant_id", sa.Text()),
    ("operation_id", sa.Text()),
    ("attempt", sa.Integer()),
    ("provider", sa.Text()),
    ("started_at", sa.DateTime(timezone=True)),
    ("finished_at", sa.DateTime(timezone=True)),
    ("result_class", sa.Text()),
    ("status_code", sa.Integer()),
    ("error_class", sa.Text()),
    ("transport_phase", sa.Text()),
    ("request_digest", sa.Text()),
    ("duration_ms", sa.Float()),
    ("evidence", pg.JSONB()),
)
RECORD_COLUMNS: tuple[tuple[str, TypeEngine[Any]], ...] = (
    ("id", sa.BigInteger()),
    ("rev", sa.BigInteger()),
    ("status", sa.Text()),
    ("reason", sa.Text()),
    ("receipt", pg.JSONB()),
    ("outcome", sa.Text()),
    ("delay", sa.Float()),
    ("digest", sa.Text()),
    ("detail", pg.JSONB()),
    *((f"a_{c}", t) for c, t in ATTEMPT_COLUMNS),
)


def status_literal(status: OperationStatus) -> Any:
    """A status as an SQL literal, not a parameter. In a WHERE clause it lets PostgreSQL
    keep one generic plan for a prepared hot-path statement: with the status as a
    parameter the planner cannot match the partial indexes (``WHERE status = 'pending'``)
    and re-plans on every execution."""
    return sa.literal_column(f"'{status.value}'")


def batch_json(rows: Sequence[dict[str, Any]]) -> str:
    """The JSON parameter of a batch (timestamps as ISO text, which PostgreSQL parses)."""
    return json.dumps(rows, default=str)


def _rows_of(name: str, columns: Sequence[tuple[str, TypeEngine[Any]]]) -> Any:
    """``WITH name AS (SELECT * FROM jsonb_to_recordset(CAST(:name AS jsonb)) AS ...)``."""
    param = sa.cast(sa.bindparam(name, type_=sa.Text()), pg.JSONB())
    fn = sa.func.jsonb_to_recordset(param).table_valued(*[sa.column(c, t) for c, t in columns])
    return sa.select(fn.render_derived(name=f"{name}_in", with_types=True)).cte(name)


def _events_of(
    moved: Any, from_status: str, to_status: Any, *, reason: Any = None, detail: Any = None
) -> Any:
    """``INSERT INTO outbox_events ... SELECT`` over the rows a data-modifying CTE moved."""
    cols = ["tenant_id", "task_id", "operation_id", "kind", "from_status", "to_status"]
    exprs = [
        moved.c.tenant_id,
        moved.c.task_id,
        moved.c.operation_id,
        sa.literal_column("'transition'"),
        sa.literal_column(f"'{from_status}'"),
        to_status,
    ]
    cols += ["actor", "fencing_token"]
    exprs += [ACTOR, moved.c.fencing_token]
    if reason is not None:
        cols += ["reason", "detail"]
        exprs += [reason, detail]
    return sa.insert(schema.events).from_select(cols, sa.select(*exprs)).cte(f"ev_{from_status}")


TIMELINE_SHIFT = 40
"""A PostgreSQL fencing token is ``timeline << 40 | nextval(outbox_fencing_seq)``."""


def fencing_token() -> Any:
    """A fresh fencing token on PostgreSQL, higher than any issued on an earlier timeline.

    A promoted standby starts a new timeline, and may lack the last values its old primary's
    sequence handed out (asynchronous replication loses the last commits; the sequence's
    own WAL runs ahead of it, but need not have reached the standby): a receiver may have
    seen a token the new primary's sequence is about to issue again. The timeline in the
    high bits puts every token of the new primary above every token of the old one. The
    timeline is read from the name of the current WAL file (its first 8 hex digits), which
    every role may call; 2**40 tokens per timeline, and tokens stay below 2**53 (exact in a
    JSON double) up to timeline 8191."""
    timeline: Any = sa.literal_column(
        "('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::int::bigint")
    return (timeline.op("<<")(TIMELINE_SHIFT)) + sa.func.nextval(schema.FENCING_SEQUENCE)


@functools.cache
def claim(eligible: Any) -> Any:
    """``pending -> claimed`` for the ids ``eligible`` selects (its LIMIT rendered), a
    fresh fencing token for the batch, and the events. Parameters: actor,
    lease. Returns the claimed rows (every column)."""
    token = sa.select(fencing_token()).scalar_subquery()
    claimed = (
        sa.update(ops)
        .where(ops.c.id.in_(eligible.scalar_subquery()))
        .values(
            status=checked_move(S.PENDING, S.CLAIMED),
            fencing_token=token,
            lease_owner=ACTOR,
            lease_expires_at=db_now(LEASE),
            state_revision=ops.c.state_revision + 1,
            updated_at=db_now(),
        )
        .returning(*(ops.c[name] for name in OPERATION_FIELDS))
        .cte("claimed")
    )
    events = _events_of(claimed, "pending", sa.literal_column(f"'{S.CLAIMED.value}'"))
    # the content read as text, decoded per row (outbox.records.raw_operation_columns)
    return sa.select(*raw_operation_columns(claimed, raw_times=False)).add_cte(events)


@functools.cache
def mark_dispatching(where: Any) -> Any:
    """``claimed -> dispatching`` for the (id, rev) pairs of parameter ``marking`` under
    ``token`` where ``where`` (deadlines, cancellation) holds, with the events. Parameters:
    marking, token, lease, actor. Returns id, revision, attempts, first and last start."""
    v = _rows_of("marking", [("id", sa.BigInteger()), ("rev", sa.BigInteger())])
    returned = (
        ops.c.id,
        ops.c.state_revision,
        ops.c.attempts,
        ops.c.first_dispatched_at,
        ops.c.last_attempt_started_at,
    )
    marked = (
        sa.update(ops)
        .where(
            ops.c.id == v.c.id,
            ops.c.state_revision == v.c.rev,
            ops.c.fencing_token == TOKEN,
            ops.c.status == status_literal(S.CLAIMED),
            where,
        )
        .values(
            status=checked_move(S.CLAIMED, S.DISPATCHING),
            attempts=ops.c.attempts + 1,
            first_dispatched_at=sa.func.coalesce(ops.c.first_dispatched_at, db_now()),
            last_attempt_started_at=db_now(),
            lease_expires_at=db_now(LEASE),
            state_revision=ops.c.state_revision + 1,
            updated_at=db_now(),
        )
        .returning(
            *returned, ops.c.tenant_id, ops.c.task_id, ops.c.operation_id, ops.c.fencing_token
        )
        .cte("marked")
    )
    events = _events_of(marked, "claimed", sa.literal_column(f"'{S.DISPATCHING.value}'"))
    return sa.select(*(marked.c[c.name] for c in returned)).add_cte(events)


@functools.cache
def record(with_digest: bool) -> Any:
    """``dispatching ->`` each row's next status (parameter ``rec``: one object per finished
    send, keys :data:`RECORD_COLUMNS`), fenced on ``token``; events for the rows moved;
    an attempt row for every send, its evidence marked ``fenced`` when the write matched
    nothing. Parameters: rec, token, actor. Returns the ids moved."""
    rec = _rows_of("rec", RECORD_COLUMNS)
    dispatching: Any = sa.literal_column(f"'{S.DISPATCHING.value}'")
    values: dict[str, Any] = {
        "status": rec.c.status,
        "status_reason": rec.c.reason,
        "receipt": sa.func.coalesce(rec.c.receipt, ops.c.receipt),
        "last_outcome": sa.func.coalesce(rec.c.outcome, ops.c.last_outcome),
        "next_attempt_at": sa.case((rec.c.delay.is_(None), None), else_=db_now(rec.c.delay)),
        # the lease ends with the transition, except while a send is still in flight
        "lease_owner": sa.case((rec.c.status == dispatching, ops.c.lease_owner)),
        "lease_expires_at": sa.case((rec.c.status == dispatching, ops.c.lease_expires_at)),
        "state_revision": ops.c.state_revision + 1,
        "updated_at": db_now(),
    }
    if with_digest:  # see queries.operation_transition_many: naming the column fires a trigger
        values["payload_digest"] = sa.func.coalesce(ops.c.payload_digest, rec.c.digest)
    moved = (
        sa.update(ops)
        .where(
            ops.c.id == rec.c.id,
            ops.c.state_revision == rec.c.rev,
            ops.c.fencing_token == TOKEN,
            ops.c.status == dispatching,
        )
        .values(**values)
        .returning(
            ops.c.id,
            ops.c.tenant_id,
            ops.c.task_id,
            ops.c.operation_id,
            ops.c.fencing_token,
            rec.c.status,
            rec.c.reason,
            rec.c.detail,
        )
        .cte("moved")
    )
    events = _events_of(
        moved, S.DISPATCHING.value, moved.c.status, reason=moved.c.reason, detail=moved.c.detail
    )
    evidence = sa.case(
        (rec.c.id.in_(sa.select(moved.c.id)), rec.c.a_evidence),
        else_=sa.func.coalesce(rec.c.a_evidence, sa.literal_column("'{}'::jsonb")).op("||")(
            sa.literal_column(f"'{json.dumps(FENCED)}'::jsonb")
        ),
    )
    attempts = (
        sa.insert(schema.attempts)
        .from_select(
            [c for c, _ in ATTEMPT_COLUMNS] + ["fencing_token", "worker"],
            sa.select(*(rec.c[f"a_{c}"] for c, _ in ATTEMPT_COLUMNS[:-1]), evidence, TOKEN, ACTOR),
        )
        .cte("att")
    )
    return sa.select(moved.c.id).add_cte(events).add_cte(attempts)
