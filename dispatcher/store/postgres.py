"""The PostgreSQL store: each protocol step is ONE statement that moves a batch of rows
and writes their ``outbox_events`` (and, for the record step, ``outbox_attempts``) rows
with data-modifying CTEs over the rows it moved; claims take ``FOR UPDATE SKIP LOCKED`` so
replicas never wait on each other; fencing tokens come from a sequence, above every token
of an earlier timeline.

Each statement is built once and bound with parameters; a batch's per-row values travel
as one JSON parameter read back with ``jsonb_to_recordset``, so the statement text is the
same whatever the batch size, SQLAlchemy compiles it once, and no row crosses the wire as
a statement of its own. The contract is :class:`dispatcher.store.interface.Store`.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql as pg
from sqlalchemy.engine import Connection
from sqlalchemy.sql.type_api import TypeEngine

from dispatcher.store import direct, journal
from dispatcher.store.common import (
    DISPATCHING_RETURNS,
    FENCED,
    TASK_LIMIT_COLUMNS,
    CommonStatements,
    claim_values,
    dispatching_values,
    eligible,
    may_dispatch,
    status_literal,
    stored_status,
    task_limits_of,
)
from dispatcher.store.transitions import Claimed, Dispatching, Recorded
from outbox import schema
from outbox.ddl import NOTIFY_CHANNEL, SETTLED_CHANNEL
from outbox.records import OPERATION_FIELDS, OperationRecord, raw_operation_columns
from outbox.states import SETTLED, OperationStatus, checked_move
from outbox.types import db_now

ops = schema.operations
tasks = schema.tasks
S = OperationStatus
SETTLED_VALUES = sorted(s.value for s in SETTLED)

TOKEN = sa.bindparam("token", type_=sa.BigInteger())
ACTOR = sa.bindparam("actor", type_=sa.Text())
LEASE = sa.bindparam("lease", type_=sa.Float())

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
    ("token", sa.BigInteger()),
    ("status", sa.Text()),
    ("reason", sa.Text()),
    ("receipt", pg.JSONB()),
    ("outcome", sa.Text()),
    ("delay", sa.Float()),
    ("digest", sa.Text()),
    ("detail", pg.JSONB()),
    *((f"a_{c}", t) for c, t in ATTEMPT_COLUMNS),
)


_ATTEMPT_KEYS = tuple((f"a_{c}", c) for c, _ in ATTEMPT_COLUMNS)
"""Each attempt column's key in the record's parameter, and its name (made once, not per
recorded send)."""


def batch_json(rows: Sequence[dict[str, Any]]) -> str:
    """The JSON parameter of a batch (timestamps as ISO 8601 text, which PostgreSQL
    parses): :func:`dispatcher.store.direct.json_text`. A NUL character in any string of
    it — a receipt or an error a provider sent back, a key — is written as
    :data:`~dispatcher.store.journal.NUL_STANDIN`: PostgreSQL refuses ``\\u0000`` in
    ``jsonb``, and with it the whole record, on every try, every row of the batch left
    ``dispatching``."""
    text = direct.json_text(rows)
    if "\\u0000" in text:  # rare: only then is the batch walked
        text = direct.json_text(journal.without_nul(rows))
    return text


def _rows_of(name: str, columns: Sequence[tuple[str, TypeEngine[Any]]]) -> Any:
    """``WITH name AS (SELECT * FROM json_to_recordset(CAST(:name AS json)) AS ...)``, a
    ``jsonb`` column read as ``json`` (:func:`_jsonb` where it is stored).

    The parameter is read as ``json``, not ``jsonb``: ``json`` is the text checked, where
    ``jsonb`` parses the whole batch into its binary form first and the record set then
    takes every value out of it again; a ``jsonb`` column in the record set is converted
    value by value either way (the record's input, 10,000 rows of its 22 columns, on the
    server: 10.5 µs a row read as ``jsonb``, 6.4 as ``json`` — ``docs/performance.md``)."""
    param = sa.cast(sa.bindparam(name, type_=sa.Text()), pg.JSON())
    read = [sa.column(c, pg.JSON() if isinstance(t, pg.JSONB) else t) for c, t in columns]
    fn = sa.func.json_to_recordset(param).table_valued(*read)
    return sa.select(fn.render_derived(name=f"{name}_in", with_types=True)).cte(name)


def _jsonb(value: Any) -> Any:
    """A ``json`` value of a batch's record set (:func:`_rows_of`) as ``jsonb``."""
    return sa.cast(value, pg.JSONB())


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


def token_expression() -> Any:
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


def idle_timeout() -> Any:
    """A held claim's own lease: its transaction's ``idle_in_transaction_session_timeout``
    set to the lease (parameter ``lease``, evaluated once), so a worker that stalls holding
    the rows (stopped, frozen) loses its session after the lease and the rows are free."""
    return sa.select(sa.func.set_config(
        "idle_in_transaction_session_timeout",
        sa.cast(sa.cast(LEASE * sa.literal_column("1000"), sa.BigInteger()), sa.Text()),
        sa.true())).scalar_subquery()


@functools.cache
def claim_statement(which: Any) -> Any:
    """``pending -> claimed`` for the ids ``which`` selects (its LIMIT rendered), a
    fresh fencing token for the batch, and the events. Parameters: actor,
    lease. Returns the claimed rows (every column)."""
    token = sa.select(token_expression()).scalar_subquery()
    claimed = (
        sa.update(ops)
        .where(ops.c.id.in_(which.scalar_subquery()))
        .values(**claim_values(token=token, actor=ACTOR, lease=LEASE))
        .returning(*(ops.c[name] for name in OPERATION_FIELDS))
        .cte("claimed")
    )
    events = _events_of(claimed, "pending", sa.literal_column(f"'{S.CLAIMED.value}'"))
    # the content read as text, decoded per row (outbox.records.raw_operation_columns),
    # then each row's task row (version, budgets) for the authority's checks
    task = sa.and_(tasks.c.tenant_id == claimed.c.tenant_id, tasks.c.task_id == claimed.c.task_id)
    return (
        sa.select(*raw_operation_columns(claimed, raw_times=False), *TASK_LIMIT_COLUMNS)
        .select_from(claimed.outerjoin(tasks, task))
        .add_cte(events)
    )


@functools.cache
def held_claim_statement(which: Any) -> Any:
    """The claim of a transaction that goes on to mark: the rows ``which`` selects (its
    LIMIT rendered, ``FOR UPDATE SKIP LOCKED``) stay ``pending`` and locked; one fresh
    fencing token; their ``pending -> claimed`` events; each row returned as the claim
    would have left it (claimed under the token, leased to ``actor`` for ``lease``
    seconds, the database clock as ``updated_at``), its revision as stored, with its task
    row. Parameters: actor, lease."""
    token = sa.select(token_expression()).scalar_subquery()
    shown = {
        **{name: ops.c[name] for name in OPERATION_FIELDS},
        **claim_values(token=token, actor=ACTOR, lease=LEASE),
        "state_revision": ops.c.state_revision,  # stored as read: the mark moves it on
    }
    claimed = which.with_only_columns(
        *(sa.type_coerce(shown[name], ops.c[name].type).label(name)
          for name in OPERATION_FIELDS)
    ).cte("claimed")
    events = _events_of(claimed, "pending", sa.literal_column(f"'{S.CLAIMED.value}'"))
    task = sa.and_(tasks.c.tenant_id == claimed.c.tenant_id, tasks.c.task_id == claimed.c.task_id)
    return (
        sa.select(*raw_operation_columns(claimed, raw_times=False), *TASK_LIMIT_COLUMNS,
                  idle_timeout().label("idle_timeout"))
        .select_from(claimed.outerjoin(tasks, task))
        .add_cte(events)
    )


@functools.cache
def claim_mark_statement(which: Any) -> Any:
    """The held claim and its mark as ONE statement, for a batch every row of which is
    expected to pass the checks: the rows ``which`` selects (its LIMIT rendered, ``FOR
    UPDATE SKIP LOCKED``) move ``pending -> dispatching`` where :func:`may_dispatch`
    holds, under one fresh token, leased to ``actor`` for ``lease`` seconds, with both
    events per row. Each moved row is returned as the held claim shows it (``claimed``,
    its revision, attempts and start times as stored before), then its task row, then
    what the mark returns (:data:`DISPATCHING_RETURNS`), then how many rows were locked
    (a row locked and not moved — its deadline passed — is the caller's sign to roll
    back and take the two-step path). Parameters: actor, lease."""
    token = sa.select(token_expression()).scalar_subquery()
    claimed = which.with_only_columns(  # locked; as stored before the statement
        *(ops.c[name].label(f"c_{name}") for name in OPERATION_FIELDS)).cte("claimed")
    values = dispatching_values(lease=LEASE) | {"fencing_token": token, "lease_owner": ACTOR}
    kept = {"fencing_token", "lease_owner", "lease_expires_at", "updated_at"}
    shown = [
        (sa.literal_column(f"'{S.CLAIMED.value}'") if name == "status"
         else ops.c[name] if name in kept else claimed.c[f"c_{name}"]).label(name)
        for name in OPERATION_FIELDS
    ]
    marked = (
        sa.update(ops)
        .where(ops.c.id == claimed.c.c_id, may_dispatch())
        .values(**values)
        .returning(*shown, *(c.label(f"d_{c.name}") for c in DISPATCHING_RETURNS))
        .cte("marked")
    )
    steps = sa.values(sa.column("step", sa.Integer()), sa.column("from_status", sa.Text()),
                      sa.column("to_status", sa.Text()), name="steps").data(
        [(1, S.PENDING.value, S.CLAIMED.value), (2, S.CLAIMED.value, S.DISPATCHING.value)])
    events = sa.insert(schema.events).from_select(
        ["tenant_id", "task_id", "operation_id", "kind", "from_status", "to_status", "actor",
         "fencing_token"],
        sa.select(marked.c.tenant_id, marked.c.task_id, marked.c.operation_id,
                  sa.literal_column("'transition'"), steps.c.from_status, steps.c.to_status,
                  ACTOR, marked.c.fencing_token)
        .select_from(marked.join(steps, sa.true()))
        .order_by(steps.c.step, marked.c.id),
    ).cte("ev_claim_mark")
    task = sa.and_(tasks.c.tenant_id == marked.c.tenant_id, tasks.c.task_id == marked.c.task_id)
    locked = sa.select(sa.func.count()).select_from(claimed).scalar_subquery()
    return (
        sa.select(*raw_operation_columns(marked, raw_times=False), *TASK_LIMIT_COLUMNS,
                  *(marked.c[f"d_{c.name}"] for c in DISPATCHING_RETURNS),
                  locked.label("locked"), idle_timeout().label("idle_timeout"))
        .select_from(marked.outerjoin(tasks, task))
        .add_cte(events)
    )


@functools.cache
def mark_statement(where: Any, held: bool = False) -> Any:
    """``claimed -> dispatching`` for the (id, rev) pairs of parameter ``marking`` under
    ``token`` where ``where`` (deadlines, cancellation) holds, with the events; ``held``:
    rows of a held claim (still ``pending``, locked by this transaction), which take the
    token and the lease here. Parameters: marking, token, lease, actor. Returns id,
    revision, attempts, first and last start."""
    v = _rows_of("marking", [("id", sa.BigInteger()), ("rev", sa.BigInteger())])
    returned = DISPATCHING_RETURNS
    values = dispatching_values(lease=LEASE)
    if held:
        values |= {"fencing_token": TOKEN, "lease_owner": ACTOR}
    marked = (
        sa.update(ops)
        .where(
            ops.c.id == v.c.id,
            ops.c.state_revision == v.c.rev,
            ops.c.status == status_literal(stored_status(S.CLAIMED, held)),
            *(() if held else (ops.c.fencing_token == TOKEN,)),
            where,
        )
        .values(**values)
        .returning(
            *returned, ops.c.tenant_id, ops.c.task_id, ops.c.operation_id, ops.c.fencing_token
        )
        .cte("marked")
    )
    events = _events_of(marked, "claimed", sa.literal_column(f"'{S.DISPATCHING.value}'"))
    return sa.select(*(marked.c[c.name] for c in returned)).add_cte(events)


NOTE_CHUNK_BYTES = 3900
"""A settled notification holds less than twice this (PostgreSQL refuses 8,000 bytes)."""


@functools.cache
def record_statement(with_digest: bool) -> Any:
    """``dispatching ->`` each row's next status (parameter ``rec``: one object per finished
    send, keys :data:`RECORD_COLUMNS`), each fenced on its own ``token`` (the sends of
    several claimed batches in one statement and one commit); events for the rows moved;
    an attempt row for every send, its evidence marked ``fenced`` when the write matched
    nothing. Parameters: rec, actor. Returns the ids moved."""
    rec = _rows_of("rec", RECORD_COLUMNS)
    dispatching: Any = sa.literal_column(f"'{S.DISPATCHING.value}'")
    values: dict[str, Any] = {
        "status": rec.c.status,
        "status_reason": rec.c.reason,
        "receipt": sa.func.coalesce(_jsonb(rec.c.receipt), ops.c.receipt),
        "last_outcome": sa.func.coalesce(rec.c.outcome, ops.c.last_outcome),
        "next_attempt_at": sa.case((rec.c.delay.is_(None), None), else_=db_now(rec.c.delay)),
        # the lease ends with the transition, except while a send is still in flight
        "lease_owner": sa.case((rec.c.status == dispatching, ops.c.lease_owner)),
        "lease_expires_at": sa.case((rec.c.status == dispatching, ops.c.lease_expires_at)),
        "state_revision": ops.c.state_revision + 1,
        "updated_at": db_now(),
    }
    if with_digest:  # naming the column fires a trigger: see CommonStatements.transition_many
        values["payload_digest"] = sa.func.coalesce(ops.c.payload_digest, rec.c.digest)
    moved = (
        sa.update(ops)
        .where(
            ops.c.id == rec.c.id,
            ops.c.state_revision == rec.c.rev,
            ops.c.fencing_token == rec.c.token,
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
            _jsonb(rec.c.detail).label("detail"),
        )
        .cte("moved")
    )
    events = _events_of(
        moved, S.DISPATCHING.value, moved.c.status, reason=moved.c.reason, detail=moved.c.detail
    )
    evidence = sa.case(
        (rec.c.id.in_(sa.select(moved.c.id)), _jsonb(rec.c.a_evidence)),
        else_=sa.func.coalesce(_jsonb(rec.c.a_evidence),
                               sa.literal_column("'{}'::jsonb")).op("||")(
            sa.literal_column(f"'{json.dumps(FENCED)}'::jsonb")
        ),
    )
    attempts = (
        sa.insert(schema.attempts)
        .from_select(
            [c for c, _ in ATTEMPT_COLUMNS] + ["fencing_token", "worker"],
            sa.select(*(rec.c[f"a_{c}"] for c, _ in ATTEMPT_COLUMNS[:-1]), evidence,
                      rec.c.token, ACTOR),
        )
        .cte("att")
    )
    return sa.select(moved.c.id, _settled_notifications(moved)).add_cte(events).add_cte(attempts)


def _settled_notifications(moved: Any) -> Any:
    """The notifications that wake the waiters (``outbox.wait_for``) of the rows ``moved``
    settled, sent when the statement commits: each a JSON array of ``[tenant_id,
    operation_id]`` pairs, as many pairs as fit in :data:`NOTE_CHUNK_BYTES` and one more,
    in id order — one notification for a batch of ordinary ids rather than one per row
    (each ``pg_notify`` is a call, a duplicate check and a queue entry on the server). A row
    whose pair alone takes :data:`NOTE_CHUNK_BYTES` or more is left out (PostgreSQL refuses
    a payload of 8,000 bytes, and with it the statement): its waiters find it by reading.
    A scalar subquery: the number of notifications sent."""
    settled: list[Any] = [sa.literal_column(f"'{v}'") for v in SETTLED_VALUES]
    pair = sa.cast(sa.func.json_build_array(moved.c.tenant_id, moved.c.operation_id), sa.Text)
    notes = (sa.select(moved.c.id, pair.label("note"))
             .where(moved.c.status.in_(settled)).subquery("notes"))
    size = sa.func.octet_length(notes.c.note)
    limit: Any = sa.literal_column(str(NOTE_CHUNK_BYTES))
    # a chunk's pairs end within one NOTE_CHUNK_BYTES of each other's running total, so
    # with each pair shorter than that a chunk holds less than twice it
    chunk = sa.func.div(sa.func.sum(size + sa.literal_column("1")).over(order_by=notes.c.id),
                        limit).label("chunk")
    chunked = sa.select(notes.c.note, chunk).where(size < limit).subquery("chunked")
    payload = sa.func.concat(sa.literal_column("'['"),
                             sa.func.string_agg(chunked.c.note, sa.literal_column("','")),
                             sa.literal_column("']'"))
    sent = (sa.select(sa.func.pg_notify(SETTLED_CHANNEL, payload).label("sent"))
            .group_by(chunked.c.chunk).subquery("sent"))
    return sa.select(sa.func.count()).select_from(sent).scalar_subquery()


@functools.cache
def _eligible(limit: int) -> sa.Select[Any]:
    # the limit is rendered, not bound: with ``LIMIT $n`` the planner's generic plan
    # guesses a tenth of the table and it re-plans on every execution instead
    return eligible(sa.literal_column(str(int(limit)))).with_for_update(skip_locked=True, of=ops)


class PostgresStore(CommonStatements):
    dialect = "postgresql"
    raw_times = False
    skip_locked = True

    def fencing_token(self, conn: Connection) -> int:
        return int(conn.execute(sa.select(token_expression())).scalar_one())

    @contextmanager
    def retention_path(self, conn: Connection) -> Iterator[None]:
        """``SET LOCAL outbox.retention_purge``: on an error the transaction is aborted
        and the local setting goes with it."""
        conn.execute(sa.select(sa.func.set_config("outbox.retention_purge", "on", True)))
        yield
        conn.execute(sa.select(sa.func.set_config("outbox.retention_purge", "off", True)))

    def resolve_unknown(self, conn: Connection, *, receipt: Any = None, **kw: Any) -> bool:
        """As every store's, with a NUL character of the look-up's receipt written as
        :data:`~dispatcher.store.journal.NUL_STANDIN` (``jsonb`` holds no U+0000: the
        row's update would fail on every reconciliation)."""
        return super().resolve_unknown(conn, receipt=journal.without_nul(receipt), **kw)

    listen_statement: str | None = f"LISTEN {NOTIFY_CHANNEL}"

    def server_port(self, conn: Connection) -> int | None:
        port = conn.exec_driver_sql("SELECT inet_server_port()").scalar()
        return None if port is None else int(port)

    def replication(self, conn: Connection) -> tuple[int, str, str] | None:
        # physical standbys only: a logical walsender (a CDC reader) is connected to a
        # database, and is no failover target
        standbys = int(conn.execute(sa.text(
            "SELECT count(*) FROM pg_stat_replication r JOIN pg_stat_activity a"
            " ON a.pid = r.pid WHERE a.datname IS NULL")).scalar_one())
        names = str(conn.execute(sa.text("SHOW synchronous_standby_names")).scalar_one())
        commit = str(conn.execute(sa.text("SHOW synchronous_commit")).scalar_one())
        return standbys, names, commit

    def take_cluster_lock(self, conn: Connection, key: int) -> bool:
        return bool(conn.execute(sa.select(sa.func.pg_try_advisory_xact_lock(key))).scalar())

    def claim(
        self,
        conn: Connection,
        *,
        worker: str,
        limit: int,
        lease_seconds: float,
        held: bool = False,
    ) -> Claimed:
        statement = (held_claim_statement(_eligible(limit)) if held
                     else claim_statement(_eligible(limit)))
        rows = direct.fetch_all(conn, statement, {"actor": worker, "lease": lease_seconds})
        n, k = len(OPERATION_FIELDS), len(TASK_LIMIT_COLUMNS)
        records = sorted((OperationRecord.from_raw_values(r[:n], typed=True) for r in rows),
                         key=lambda r: r.id)
        token = int(records[0].fencing_token or 0) if records else 0
        return Claimed(token, records, task_limits_of([r[n:n + k] for r in rows]))

    marks_in_claim = True

    def claim_and_mark(
        self, conn: Connection, *, worker: str, limit: int, lease_seconds: float,
        begin: bool = False,
    ) -> tuple[Claimed, list[Dispatching]] | None:
        run = direct.begin_and_fetch if begin else direct.fetch_all
        rows = run(conn, claim_mark_statement(_eligible(limit)),
                   {"actor": worker, "lease": lease_seconds})
        n, k, d = len(OPERATION_FIELDS), len(TASK_LIMIT_COLUMNS), len(DISPATCHING_RETURNS)
        if rows and len(rows) < rows[0][n + k + d]:
            return None  # a locked row was not moved (a deadline passed): two steps
        rows = sorted(rows, key=lambda r: int(r[0]))
        records = [OperationRecord.from_raw_values(r[:n], typed=True) for r in rows]
        token = int(records[0].fencing_token or 0) if records else 0
        marks = [Dispatching(*r[n + k:n + k + d]) for r in rows]
        return (Claimed(token, records, task_limits_of([r[n:n + k] for r in rows])), marks)

    def mark_dispatching(
        self,
        conn: Connection,
        *,
        token: int,
        pairs: Sequence[tuple[int, int]],
        lease_seconds: float,
        actor: str,
        held: bool = False,
    ) -> list[Dispatching]:
        if not pairs:
            return []
        rows = direct.fetch_all(
            conn,
            mark_statement(may_dispatch(), held),
            {
                "marking": batch_json([{"id": i, "rev": r} for i, r in pairs]),
                "token": token,
                "lease": lease_seconds,
                "actor": actor,
            },
        )
        return [Dispatching(r[0], r[1], r[2], r[3], r[4]) for r in rows]

    def record_many(
        self, conn: Connection, *, items: Sequence[Recorded], actor: str
    ) -> set[int]:
        if not items:
            return set()
        rows = [
            {
                "id": t.id,
                "rev": t.state_revision,
                "token": r.token,
                "status": checked_move(S.DISPATCHING, t.status),
                "reason": t.status_reason,
                "receipt": t.receipt,
                "outcome": t.last_outcome,
                "delay": t.delay_seconds,
                "digest": t.payload_digest,
                "detail": r.detail,
                **{key: r.attempt[c] for key, c in _ATTEMPT_KEYS},
            }
            for r in items
            for t in (r.transition,)
        ]
        with_digest = any(r.transition.payload_digest is not None for r in items)
        moved = direct.fetch_all(
            conn,
            record_statement(with_digest),
            {"rec": batch_json(rows), "actor": actor},
        )
        return {r[0] for r in moved}
