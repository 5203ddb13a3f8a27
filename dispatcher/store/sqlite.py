"""The SQLite store: the caller's ``BEGIN IMMEDIATE`` makes the dispatcher the one writer
(so a claim needs no row locks, and a held claim's rows stay ``pending`` and untouched by
any other writer until the transaction ends), fencing tokens come from a counter row in
``outbox_meta``, and each step's ``outbox_events`` rows are written beside its statement,
in the same transaction. The contract is :class:`dispatcher.store.interface.Store`."""

from __future__ import annotations

import functools
import json
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection
from sqlalchemy.ext.compiler import compiles

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
from dispatcher.store.transitions import Claimed, Dispatching, Recorded, Transition
from outbox import decoding, schema
from outbox.records import OPERATION_FIELDS, OperationRecord, raw_operation_columns
from outbox.states import OperationStatus

ops = schema.operations
tasks = schema.tasks
meta = schema.meta
S = OperationStatus
PENDING_IN_ID_ORDER = "INDEXED BY ix_outbox_operations_pending_id"
"""The claim reads pending rows through their partial index, in id order, and stops after
one batch. Left to itself SQLite's planner prefers ``(status, updated_at)`` (an equality
on its first column) and sorts every pending row on each claim: 6.6 ms at 20,000 pending,
65 ms at 200,000; through the partial index 0.01 ms at either."""


@compiles(sa.Table, "sqlite")
def _table_with_hint(table: sa.Table, compiler: Any, **kw: Any) -> str:
    """SQLite's ``INDEXED BY`` from a statement's ``with_hint(table, text, "sqlite")``
    (SQLAlchemy's SQLite compiler renders no table hints of its own)."""
    text: str = compiler.visit_table(table, **kw)
    hints = kw.get("fromhints")
    if kw.get("asfrom") and hints and table in hints:
        text += f" {hints[table]}"
    return text


def claimable(limit: int | Any) -> sa.Select[Any]:
    """The ids a claim takes: :func:`~dispatcher.store.common.eligible` read through the
    pending rows' partial index."""
    return eligible(limit).with_hint(ops, PENDING_IN_ID_ORDER, "sqlite")


# -- the hot path's statements: each built and compiled once, run on the driver's cursor
# (dispatcher.store.direct); a batch's ids or (id, revision) pairs are one JSON parameter
def from_json(name: str, *paths: str) -> sa.Select[Any]:
    """The rows of the JSON array parameter ``name``: each element's values at ``paths``
    (the element itself without any)."""
    each = sa.func.json_each(sa.bindparam(name, type_=sa.Text())).table_valued("value")
    if not paths:
        return sa.select(each.c.value)
    return sa.select(*(sa.func.json_extract(each.c.value, sa.literal_column(f"'{p}'"))
                       for p in paths))


@functools.cache
def fencing_statement() -> Any:
    """The fencing counter (``outbox_meta``'s ``fencing`` row) moved on by one; returns
    its new value."""
    return (
        sa.update(meta)
        .where(meta.c.tenant_id == "*", meta.c.name == "fencing")
        .values(value=sa.cast(sa.cast(meta.c.value, sa.Integer) + 1, sa.Text))
        .returning(meta.c.value)
    )


@functools.cache
def claim_statement() -> Any:
    """``pending -> claimed`` for up to ``limit`` eligible rows under ``token``, leased to
    ``actor`` for ``lease`` seconds; returns the rows (:func:`raw_operation_columns`)."""
    b = sa.bindparam
    return (
        sa.update(ops)
        .where(ops.c.id.in_(claimable(b("limit", type_=sa.Integer())).scalar_subquery()))
        .values(**claim_values(token=b("token", type_=sa.BigInteger()),
                               actor=b("actor", type_=sa.Text()),
                               lease=b("lease")))
        .returning(*raw_operation_columns(ops, raw_times=True))
    )


@functools.cache
def held_claim_statement() -> Any:
    """The claim of a transaction that goes on to mark: up to ``limit`` eligible rows,
    left ``pending`` (the caller's ``BEGIN IMMEDIATE`` keeps every other writer out until
    it ends), each returned as :func:`claim_statement` would have left it — claimed under
    ``token``, leased to ``actor`` for ``lease`` seconds, the database clock as
    ``updated_at`` — its revision as stored (:func:`raw_operation_columns`)."""
    b = sa.bindparam
    shown = {
        **{name: ops.c[name] for name in OPERATION_FIELDS},
        **claim_values(token=b("token", type_=sa.BigInteger()),
                       actor=b("actor", type_=sa.Text()), lease=b("lease")),
        "state_revision": ops.c.state_revision,  # stored as read: the mark moves it on
    }
    claimed = (
        sa.select(*(sa.type_coerce(shown[name], ops.c[name].type).label(name)
                    for name in OPERATION_FIELDS))
        .where(ops.c.id.in_(claimable(b("limit", type_=sa.Integer())).scalar_subquery()))
        .subquery("claimed")
    )
    return sa.select(*raw_operation_columns(claimed, raw_times=True))


@functools.cache
def mark_statement(held: bool = False) -> Any:
    """``claimed -> dispatching`` for the ``pairs`` (a JSON array of [id, revision]) still
    claimed under ``token`` that may dispatch, the lease renewed for ``lease`` seconds;
    returns :data:`DISPATCHING_RETURNS`. ``held``: rows of a held claim (still
    ``pending`` in this transaction), which take the token and ``actor``'s lease here."""
    b = sa.bindparam
    values = dispatching_values(lease=b("lease"))
    if held:
        values |= {"fencing_token": b("token", type_=sa.BigInteger()),
                   "lease_owner": b("actor", type_=sa.Text())}
    return (
        sa.update(ops)
        .where(
            ops.c.id.in_(from_json("pairs", "$[0]")),
            sa.tuple_(ops.c.id, ops.c.state_revision).in_(from_json("pairs", "$[0]", "$[1]")),
            *(() if held else (ops.c.fencing_token == b("token", type_=sa.BigInteger()),)),
            # `status || ''`: no index on status for this term, or SQLite's planner, which
            # cannot size the JSON lists, walks every claimed row instead of the batch's ids
            ops.c.status.concat(sa.literal_column("''"))
            == status_literal(stored_status(S.CLAIMED, held)),
            may_dispatch(),
        )
        .values(**values)
        .returning(*DISPATCHING_RETURNS)
    )


@functools.cache
def events_statement(
    from_status: OperationStatus, to_status: OperationStatus, token: bool = False
) -> Any:
    """``from_status -> to_status`` events for the rows whose ids are the JSON array
    ``ids``, copied from the rows (their token included; ``token``: the parameter
    ``token`` instead, for rows a held claim has not yet written it to) in id order, by
    ``actor``."""
    columns = ["tenant_id", "task_id", "operation_id", "kind", "from_status", "to_status",
               "actor", "fencing_token"]
    return sa.insert(schema.events).from_select(
        columns,
        sa.select(
            ops.c.tenant_id, ops.c.task_id, ops.c.operation_id,
            sa.literal_column("'transition'"),
            status_literal(from_status), status_literal(to_status),
            sa.bindparam("actor", type_=sa.Text()),
            sa.bindparam("token", type_=sa.BigInteger()) if token else ops.c.fencing_token,
        )
        .where(ops.c.id.in_(from_json("ids")))
        .order_by(ops.c.id),
    )


@functools.cache
def task_limits_statement() -> Any:
    """:data:`TASK_LIMIT_COLUMNS` of the tasks whose (tenant, task) pairs are the JSON
    array ``tasks``."""
    return sa.select(*TASK_LIMIT_COLUMNS).where(
        sa.tuple_(tasks.c.tenant_id, tasks.c.task_id).in_(from_json("tasks", "$[0]", "$[1]")))


def _json(values: Any) -> str:
    return json.dumps(values, separators=(",", ":"))


def _time(text: str) -> datetime:
    """A timestamp the mark returns (its own clock, or one the claim already parsed)."""
    value = decoding.parse_time(text, "timestamp")
    if not isinstance(value, datetime):
        raise ValueError(f"not a stored timestamp: {value}")
    return value


class SQLiteStore(CommonStatements):
    dialect = "sqlite"
    raw_times = True
    skip_locked = False
    marks_in_claim = False  # the one writer's claim and mark are statements of their own

    def claim_and_mark(
        self, conn: Connection, *, worker: str, limit: int, lease_seconds: float,
        begin: bool = False,
    ) -> tuple[Claimed, list[Dispatching]] | None:
        return None  # never called (marks_in_claim): the caller takes the two steps

    def execute_many(
        self, conn: Connection, statement: Any, rows: Sequence[Mapping[str, Any]]
    ) -> int:
        """On the driver's cursor (:func:`dispatcher.store.direct.execute_many`): the same
        values stored, without SQLAlchemy's per-row parameter work; SQLite counts the rows
        each execution changed (not those its triggers did)."""
        return direct.execute_many(conn, statement, rows)

    def replication(self, conn: Connection) -> tuple[int, str, str] | None:
        """None: a SQLite file has no standbys."""
        return None

    @contextmanager
    def retention_path(self, conn: Connection) -> Iterator[None]:
        """A transient ``outbox_meta`` flag row the database rules look for."""
        flag = meta.c.tenant_id == "*", meta.c.name == "retention_purge"
        conn.execute(sa.delete(meta).where(*flag))
        conn.execute(sa.insert(meta).values(tenant_id="*", name="retention_purge", value="1"))
        try:
            yield
        finally:
            conn.execute(sa.delete(meta).where(*flag))

    listen_statement: str | None = None
    """No notifications: a SQLite file is polled."""

    def server_port(self, conn: Connection) -> int | None:
        """None: no server."""
        return None

    def take_cluster_lock(self, conn: Connection, key: int) -> bool:
        """Always had: SQLite has one writer at a time anyway."""
        return True

    def fencing_token(self, conn: Connection) -> int:
        """A fresh value of the monotonic fencing counter (the ``fencing`` row)."""
        ((value,),) = direct.fetch_all(conn, fencing_statement(), {})
        return int(value)

    def claim(
        self,
        conn: Connection,
        *,
        worker: str,
        limit: int,
        lease_seconds: float,
        held: bool = False,
    ) -> Claimed:
        token = self.fencing_token(conn)
        rows = direct.fetch_all(conn, held_claim_statement() if held else claim_statement(),
                                {"limit": limit, "token": token, "actor": worker,
                                 "lease": float(lease_seconds)})
        records = sorted((OperationRecord.from_raw_values(r) for r in rows), key=lambda r: r.id)
        if not records:
            return Claimed(0, [], {})
        direct.fetch_all(conn, events_statement(S.PENDING, S.CLAIMED, token=held),
                         {"ids": _json([r.id for r in records]), "actor": worker,
                          **({"token": token} if held else {})})
        pairs = sorted({(r.tenant_id, r.task_id) for r in records})
        found = direct.fetch_all(conn, task_limits_statement(), {"tasks": _json(pairs)})
        return Claimed(token, records, task_limits_of(found))

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
            conn, mark_statement(held),
            {"pairs": _json(pairs), "token": token, "lease": float(lease_seconds),
             **({"actor": actor} if held else {})})
        if rows:
            direct.fetch_all(conn, events_statement(S.CLAIMED, S.DISPATCHING),
                             {"ids": _json([r[0] for r in rows]), "actor": actor})
        return [Dispatching(r[0], r[1], r[2], _time(r[3]), _time(r[4])) for r in rows]

    def record_many(
        self, conn: Connection, *, items: Sequence[Recorded], actor: str
    ) -> set[int]:
        """An executemany per fencing token (the caller's one transaction), then the
        events and attempt rows in two inserts."""
        if not items:
            return set()
        by_token: dict[int, list[Transition]] = {}
        for r in items:
            by_token.setdefault(r.token, []).append(r.transition)
        moved: set[int] = set()
        for token, transitions in by_token.items():
            moved |= self.transition_many(
                conn, token=token, expected=S.DISPATCHING, items=transitions)
        journal.write(
            conn,
            [
                journal.event(
                    r.op,
                    from_status=S.DISPATCHING.value,
                    to_status=r.transition.status.value,
                    reason=r.transition.status_reason,
                    actor=actor,
                    fencing_token=r.token,
                    detail=r.detail,
                )
                for r in items
                if r.op.id in moved
            ],
            [
                r.attempt
                if r.op.id in moved
                else {**r.attempt, "evidence": {**(r.attempt["evidence"] or {}), **FENCED}}
                for r in items
            ],
            execute_many=direct.execute_many,
        )
        return moved
