"""What both stores write the same way, once: the predicates (eligible, may dispatch,
fenced), the SET clauses of the claim and of the dispatching mark, and the statements
whose text is the same on both dialects (:class:`CommonStatements`)."""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping, Sequence
from contextlib import AbstractContextManager
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Connection

from dispatcher.store import retention
from dispatcher.store.transitions import Transition
from outbox import schema
from outbox.records import OperationRecord, raw_operation_columns
from outbox.recovery import VERIFICATION_FAILED, VERIFIER_META_PREFIX
from outbox.states import NON_TERMINAL, OperationStatus, check_transition, checked_move
from outbox.types import JSONType, db_now, in_pairs, is_due

ops = schema.operations
tasks = schema.tasks
approvals = schema.approvals
S = OperationStatus
_NON_TERMINAL = sorted(s.value for s in NON_TERMINAL)
FENCED = {"fenced": True}
"""Merged into the evidence of an attempt whose write matched nothing."""


def status_literal(status: OperationStatus) -> Any:
    """A status as an SQL literal, not a parameter. In a WHERE clause it lets PostgreSQL
    keep one generic plan for a prepared hot-path statement: with the status as a
    parameter the planner cannot match the partial indexes (``WHERE status = 'pending'``)
    and re-plans on every execution."""
    return sa.literal_column(f"'{status.value}'")


# -- predicates ------------------------------------------------------------------------
def eligible(limit: int | Any) -> sa.Select[Any]:
    """Pending rows that are due, whose task is not cancelled, and that are first in line
    for their ordering key (no earlier non-terminal operation with the same key), oldest
    first, at most ``limit``."""
    earlier = ops.alias("earlier")
    blocked_by_order = sa.exists().where(
        earlier.c.ordering_key == ops.c.ordering_key,
        earlier.c.id < ops.c.id,
        earlier.c.status.in_([status_literal(S(v)) for v in _NON_TERMINAL]),
    )
    return (
        sa.select(ops.c.id)
        .where(
            ops.c.status == status_literal(S.PENDING),
            is_due(ops.c.next_attempt_at),
            ~task_cancelled(),
            sa.or_(ops.c.ordering_key.is_(None), ~blocked_by_order),
        )
        .order_by(ops.c.id)
        .limit(limit)
    )


def moved_by(token: int, items: Sequence[Transition]) -> sa.Select[Any]:
    """The ids of ``items`` now at their new status and revision under ``token``."""
    return sa.select(ops.c.id).where(
        in_pairs((ops.c.id, ops.c.state_revision, ops.c.status),
                 [(t.id, t.state_revision + 1, t.status.value) for t in items], searched=1),
        ops.c.fencing_token == token,
    )


def stored_status(status: OperationStatus, held: bool) -> OperationStatus:
    """The status a row shown as ``status`` is stored in: a held claim
    (:meth:`dispatcher.store.interface.Store.claim` with ``held``) shows its rows
    ``claimed`` while they stay ``pending``, locked by the claiming transaction."""
    return S.PENDING if held and status == S.CLAIMED else status


def fence(token: Any, expected: OperationStatus, held: bool) -> Any:
    """A write's fence: still in ``expected`` under ``token``. A held claim's rows are
    fenced by the claiming transaction's row locks instead (still ``pending``; the
    write sets the token)."""
    if held:
        return ops.c.status == stored_status(expected, held).value
    return sa.and_(ops.c.fencing_token == token, ops.c.status == expected.value)


@functools.cache
def transition_statement(
    expected: OperationStatus, with_digest: bool, held: bool = False
) -> Any:
    """``expected ->`` each row's next status, fenced on revision and token (``held``: on
    the claiming transaction's locks, :func:`fence`); one parameter set per row
    (``b_id``, ``b_rev``, ``b_token``, ``b_status``, ``b_reason``, ``b_has_receipt``,
    ``b_receipt``, ``b_outcome``, ``b_delay``, ``b_digest``)."""
    b = sa.bindparam
    stmt = (
        sa.update(ops)
        .where(
            ops.c.id == b("b_id"),
            ops.c.state_revision == b("b_rev"),
            fence(b("b_token"), expected, held),
        )
        .values(
            status=b("b_status"),
            status_reason=b("b_reason"),
            receipt=sa.case(
                (b("b_has_receipt", type_=sa.Boolean), b("b_receipt", type_=JSONType)),
                else_=ops.c.receipt,
            ),
            last_outcome=sa.func.coalesce(b("b_outcome", type_=sa.Text), ops.c.last_outcome),
            next_attempt_at=sa.case(
                (sa.cast(b("b_delay"), sa.Float).is_(None), None),
                else_=db_now(sa.cast(b("b_delay"), sa.Float)),
            ),
            # the lease ends with the transition, except while a send is still in flight
            lease_owner=sa.case(
                (b("b_status") == S.DISPATCHING.value, ops.c.lease_owner), else_=None
            ),
            lease_expires_at=sa.case(
                (b("b_status") == S.DISPATCHING.value, ops.c.lease_expires_at), else_=None
            ),
            state_revision=ops.c.state_revision + 1,
            updated_at=db_now(),
        )
    )
    if held:  # the claim wrote no token: this write does
        stmt = stmt.values(fencing_token=b("b_token"))
    if with_digest:
        # fill the digest of plain-SQL rows once (the immutability trigger allows
        # NULL -> value; naming the column makes it fire, so the common path leaves it out)
        stmt = stmt.values(
            payload_digest=sa.func.coalesce(ops.c.payload_digest, b("b_digest", type_=sa.Text))
        )
    return stmt


@functools.cache
def may_dispatch() -> Any:
    """Neither the row's own deadline nor its task's has passed on the database clock,
    and its task is not cancelled."""
    return sa.and_(
        sa.or_(ops.c.deadline_at.is_(None), ops.c.deadline_at > db_now()),
        ~task_deadline_passed(),
        ~task_cancelled(),
    )


def task_deadline_passed() -> Any:
    return sa.exists().where(
        tasks.c.tenant_id == ops.c.tenant_id,
        tasks.c.task_id == ops.c.task_id,
        tasks.c.deadline_at.isnot(None),
        tasks.c.deadline_at <= db_now(),
    )


def task_cancelled() -> Any:
    return sa.exists().where(
        tasks.c.tenant_id == ops.c.tenant_id,
        tasks.c.task_id == ops.c.task_id,
        tasks.c.cancelled_at.isnot(None),
    )


def fenced(token: int, pairs: Iterable[tuple[int, int]], status: OperationStatus) -> Any:
    """The rows of ``pairs`` (id, revision) still in ``status`` under ``token``."""
    return sa.and_(
        in_pairs((ops.c.id, ops.c.state_revision), pairs, searched=1),
        ops.c.fencing_token == token,
        ops.c.status == status.value,
    )


# -- SET clauses -----------------------------------------------------------------------
def claim_values(*, token: Any, actor: Any, lease: Any) -> dict[str, Any]:
    """``pending -> claimed`` under ``token``, leased to ``actor`` for ``lease`` seconds."""
    return {
        "status": checked_move(S.PENDING, S.CLAIMED),
        "fencing_token": token,
        "lease_owner": actor,
        "lease_expires_at": db_now(lease),
        "state_revision": ops.c.state_revision + 1,
        "updated_at": db_now(),
    }


def dispatching_values(*, lease: Any) -> dict[str, Any]:
    """``claimed -> dispatching``: the attempt counted, ``first_dispatched_at`` set once,
    the lease renewed for ``lease`` seconds."""
    return {
        "status": checked_move(S.CLAIMED, S.DISPATCHING),
        "attempts": ops.c.attempts + 1,
        "first_dispatched_at": sa.func.coalesce(ops.c.first_dispatched_at, db_now()),
        "last_attempt_started_at": db_now(),
        "lease_expires_at": db_now(lease),
        "state_revision": ops.c.state_revision + 1,
        "updated_at": db_now(),
    }


TASK_LIMIT_COLUMNS = (
    tasks.c.id,
    tasks.c.tenant_id,
    tasks.c.task_id,
    tasks.c.workflow_version,
    tasks.c.max_attempts,
    tasks.c.max_elapsed_seconds,
)
"""What the authority reads of a task: its version and budgets."""


def task_limits_of(rows: Sequence[Sequence[Any]]) -> dict[tuple[str, str], dict[str, Any]]:
    """Task rows (columns :data:`TASK_LIMIT_COLUMNS`) keyed by (tenant, task); rows of
    an outer join that found no task (id NULL) are left out."""
    names = [c.name for c in TASK_LIMIT_COLUMNS]
    return {(r[1], r[2]): dict(zip(names, r, strict=True)) for r in rows if r[0] is not None}


DISPATCHING_RETURNS = (
    ops.c.id,
    ops.c.state_revision,
    ops.c.attempts,
    ops.c.first_dispatched_at,
    ops.c.last_attempt_started_at,
)
"""What the dispatching mark returns per row (a :class:`.transitions.Dispatching`)."""


# -- the statements that are the same on both dialects ---------------------------------
class CommonStatements:
    """The statements both stores run with the same text (the repair paths' statements
    are each conditional on the revision read, so a concurrent worker, reconciler or
    operator wins and the losing write matches nothing)."""

    dialect: str
    raw_times: bool
    """Times come back as text (SQLite) and are parsed per row."""
    skip_locked: bool
    """Reads that pick rows to move skip rows another transaction holds (PostgreSQL)."""

    def db_now(self, conn: Connection) -> datetime:
        value = conn.execute(sa.select(db_now())).scalar_one()
        assert isinstance(value, datetime)
        return value

    def transition_many(
        self,
        conn: Connection,
        *,
        token: int,
        expected: OperationStatus,
        items: Sequence[Transition],
        held: bool = False,
    ) -> set[int]:
        """One executemany plus one read-back of which rows this batch actually moved
        (the token is unique to the batch, so ``revision + 1`` in the new status under our
        token can only be our write; an item whose revision was already stale is not read
        back as moved by the row's own later revision). No read-back where the driver
        counted as many rows changed as there are items: each item names one row by its
        id, so every item moved its row."""
        if not items:
            return set()
        with_digest = any(t.payload_digest is not None for t in items)
        changed = self.execute_many(
            conn,
            transition_statement(expected, with_digest, held),
            [
                {
                    "b_id": t.id,
                    "b_rev": t.state_revision,
                    "b_token": token,
                    "b_status": checked_move(expected, t.status),
                    "b_reason": t.status_reason,
                    "b_has_receipt": t.receipt is not None,
                    "b_receipt": t.receipt,
                    "b_outcome": t.last_outcome,
                    "b_delay": t.delay_seconds,
                    "b_digest": t.payload_digest,
                }
                for t in items
            ],
        )
        if changed == len(items):
            return {t.id for t in items}
        return set(conn.execute(moved_by(token, items)).scalars())

    def execute_many(
        self, conn: Connection, statement: Any, rows: Sequence[Mapping[str, Any]]
    ) -> int | None:
        """An executemany of ``statement`` in ``conn``'s transaction; the rows it changed
        where the driver counts them reliably over an executemany, else None."""
        if rows:
            conn.execute(statement, list(rows))
        return None

    def extend_leases(
        self,
        conn: Connection,
        *,
        token: int,
        pairs: Sequence[tuple[int, int]],
        lease_seconds: float,
    ) -> set[int]:
        if not pairs:
            return set()
        result = conn.execute(
            sa.update(ops)
            .where(fenced(token, pairs, S.DISPATCHING))
            .values(lease_expires_at=db_now(lease_seconds))
            .returning(ops.c.id)
        )
        return set(result.scalars())

    def refusal_reasons(
        self, conn: Connection, ids: Sequence[int], held: bool = False
    ) -> dict[int, tuple[OperationStatus, str]]:
        if not ids:
            return {}
        rows = conn.execute(
            sa.select(
                ops.c.id, tasks.c.cancelled_at, ops.c.deadline_at, tasks.c.deadline_at, db_now()
            )
            .select_from(
                ops.outerjoin(
                    tasks,
                    sa.and_(
                        tasks.c.tenant_id == ops.c.tenant_id, tasks.c.task_id == ops.c.task_id
                    ),
                )
            )
            .where(ops.c.id.in_(list(ids)),
                   ops.c.status == stored_status(S.CLAIMED, held).value)
        ).all()
        reasons: dict[int, tuple[OperationStatus, str]] = {}
        for op_id, cancelled_at, op_deadline, task_deadline, now in rows:
            if cancelled_at is not None:
                reasons[op_id] = (S.CANCELLED, "task_cancelled")
            elif (op_deadline is not None and op_deadline <= now) or (
                task_deadline is not None and task_deadline <= now
            ):
                reasons[op_id] = (S.BLOCKED, "deadline_passed")
        return reasons

    # -- the repair paths: lease recovery and reconciliation of ``unknown`` rows ---------
    def _columns(self) -> list[Any]:
        """Every column, content read as text and decoded per row: one undecodable row
        never fails a recovery or reconciliation pass (:mod:`outbox.decoding`)."""
        return raw_operation_columns(ops, raw_times=self.raw_times)

    def expired_leases(self, conn: Connection, *, limit: int) -> list[OperationRecord]:
        q = (
            sa.select(*self._columns())
            .where(
                ops.c.status.in_([S.CLAIMED.value, S.DISPATCHING.value]),
                ops.c.lease_expires_at < db_now(),
            )
            .order_by(ops.c.lease_expires_at)
            .limit(limit)
        )
        if self.skip_locked:
            q = q.with_for_update(skip_locked=True)
        return [OperationRecord.from_raw_values(r) for r in conn.execute(q).all()]

    def recover_leases(
        self, conn: Connection, rows: Sequence[OperationRecord]
    ) -> list[OperationRecord]:
        moved: list[OperationRecord] = []
        for status, target, reason in (
            (S.CLAIMED, S.PENDING, None),
            (S.DISPATCHING, S.UNKNOWN, "lease_expired_while_dispatching"),
        ):
            pairs = [(r.id, r.state_revision) for r in rows if r.status == status]
            if not pairs:
                continue
            values: dict[str, Any] = {
                "status": checked_move(status, target),
                "status_reason": reason,
                "lease_owner": None,
                "lease_expires_at": None,
                "state_revision": ops.c.state_revision + 1,
                "updated_at": db_now(),
            }
            if target == S.UNKNOWN:
                values["last_outcome"] = "lost"
                values["next_attempt_at"] = None
            result = conn.execute(
                sa.update(ops)
                .where(
                    in_pairs((ops.c.id, ops.c.state_revision), pairs, searched=1),
                    ops.c.status == status.value,
                    ops.c.lease_expires_at < db_now(),
                )
                .values(**values)
                .returning(*self._columns())
            ).all()
            moved.extend(OperationRecord.from_raw_values(r) for r in result)
        return moved

    def unknown_due(self, conn: Connection, *, limit: int) -> list[OperationRecord]:
        return [
            OperationRecord.from_raw_values(r)
            for r in conn.execute(
                sa.select(*self._columns())
                .where(
                    ops.c.status == S.UNKNOWN.value,
                    sa.or_(ops.c.next_attempt_at.is_(None), ops.c.next_attempt_at <= db_now()),
                )
                .order_by(ops.c.next_attempt_at, ops.c.id)
                .limit(limit)
            ).all()
        ]

    def resolve_unknown(
        self,
        conn: Connection,
        *,
        row: OperationRecord,
        status: OperationStatus,
        reason: str | None,
        receipt: Any = None,
        last_outcome: str | None = None,
        delay_seconds: float | None = None,
    ) -> bool:
        values: dict[str, Any] = {
            "status": checked_move(S.UNKNOWN, status),
            "status_reason": reason,
            "state_revision": ops.c.state_revision + 1,
            "updated_at": db_now(),
            "next_attempt_at": None if delay_seconds is None else db_now(delay_seconds),
        }
        if receipt is not None:
            values["receipt"] = receipt
        if last_outcome is not None:
            values["last_outcome"] = last_outcome
        result = conn.execute(
            sa.update(ops)
            .where(
                ops.c.id == row.id,
                ops.c.state_revision == row.state_revision,
                ops.c.status == S.UNKNOWN.value,
            )
            .values(**values)
        )
        return bool(result.rowcount)

    def look_again(self, conn: Connection, *, row: OperationRecord, delay_seconds: float) -> None:
        conn.execute(
            sa.update(ops)
            .where(
                ops.c.id == row.id,
                ops.c.state_revision == row.state_revision,
                ops.c.status == S.UNKNOWN.value,
            )
            .values(next_attempt_at=db_now(delay_seconds))
        )

    # -- the authority's reads and writes: task limits, budgets spent, approvals ----------
    def task_limits(
        self, conn: Connection, pairs: Sequence[tuple[str, str]], *, lock_budgeted: bool
    ) -> dict[tuple[str, str], dict[str, Any]]:
        found: dict[tuple[str, str], dict[str, Any]] = {
            (t["tenant_id"], t["task_id"]): dict(t)
            for t in conn.execute(
                sa.select(tasks.c.id, tasks.c.tenant_id, tasks.c.task_id,
                          tasks.c.workflow_version, tasks.c.max_attempts,
                          tasks.c.max_elapsed_seconds)
                .where(in_pairs((tasks.c.tenant_id, tasks.c.task_id), sorted(set(pairs))))
                .order_by(tasks.c.id)
            ).mappings()
        }
        budgeted = [t["id"] for t in found.values() if budgeted_task(t)]
        if lock_budgeted and budgeted and self.skip_locked:  # SQLite: the one writer already
            conn.execute(sa.select(tasks.c.id).where(tasks.c.id.in_(budgeted))
                         .order_by(tasks.c.id).with_for_update())
        return found

    def task_spending(
        self, conn: Connection, pairs: Sequence[tuple[str, str]]
    ) -> dict[tuple[str, str], tuple[int, datetime | None]]:
        if not pairs:
            return {}
        rows = conn.execute(
            sa.select(ops.c.tenant_id, ops.c.task_id, sa.func.sum(ops.c.attempts),
                      sa.func.min(ops.c.first_dispatched_at))
            .where(in_pairs((ops.c.tenant_id, ops.c.task_id), pairs))
            .group_by(ops.c.tenant_id, ops.c.task_id)
        ).all()
        return {(tenant, task): (int(attempts or 0), first)
                for tenant, task, attempts, first in rows}

    def approvals_for(
        self, conn: Connection, pairs: Sequence[tuple[str, str]]
    ) -> list[dict[str, Any]]:
        if not pairs:
            return []
        query = (
            sa.select(approvals)
            .where(in_pairs((approvals.c.tenant_id, approvals.c.operation_id),
                            sorted(set(pairs))))
            .order_by(approvals.c.id)
        )
        if self.skip_locked:
            query = query.with_for_update()
        return [dict(r) for r in conn.execute(query).mappings()]

    def consume_approvals(self, conn: Connection, ids: Sequence[int], token: int) -> set[int]:
        if not ids:
            return set()
        return set(conn.execute(
            sa.update(approvals)
            .where(approvals.c.id.in_(list(ids)), approvals.c.consumed_at.is_(None))
            .values(consumed_at=db_now(), consumed_fencing_token=token)
            .returning(approvals.c.id)
        ).scalars())

    # -- the verifier --------------------------------------------------------------------
    def publish_verifiers(self, conn: Connection, verifies: Mapping[str, bool]) -> None:
        meta = schema.meta
        insert = postgresql.insert if self.dialect == "postgresql" else sqlite.insert
        for name, verifying in sorted(verifies.items()):
            stmt = insert(meta).values(tenant_id="*", name=VERIFIER_META_PREFIX + name,
                                       value="1" if verifying else "0")
            conn.execute(stmt.on_conflict_do_update(
                index_elements=[meta.c.tenant_id, meta.c.name],
                set_={"value": stmt.excluded.value},
            ))

    def verification_due(
        self, conn: Connection, providers: Sequence[str], *, limit: int
    ) -> list[OperationRecord]:
        if not providers:
            return []
        rows = conn.execute(
            sa.select(*self._columns())
            .where(
                ops.c.status == S.APPLIED.value,
                ops.c.provider.in_(sorted(providers)),
                sa.or_(ops.c.status_reason.is_(None), ops.c.status_reason != VERIFICATION_FAILED),
                sa.or_(ops.c.next_attempt_at.is_(None), ops.c.next_attempt_at <= db_now()),
            )
            .order_by(ops.c.id)
            .limit(limit)
        ).all()
        return [OperationRecord.from_raw_values(r) for r in rows]

    def verify_later(self, conn: Connection, *, row: OperationRecord, delay_seconds: float) -> None:
        conn.execute(
            sa.update(ops).where(_still(row, S.APPLIED))
            .values(next_attempt_at=db_now(delay_seconds))
        )

    def record_verification(
        self, conn: Connection, *, row: OperationRecord, verified: bool
    ) -> bool:
        to = S.VERIFIED if verified else S.APPLIED
        if verified:
            check_transition(S.APPLIED, S.VERIFIED)
        return bool(conn.execute(
            sa.update(ops)
            .where(_still(row, S.APPLIED))
            .values(
                status=to.value,
                status_reason=None if verified else VERIFICATION_FAILED,
                next_attempt_at=None,
                state_revision=ops.c.state_revision + 1,
                updated_at=db_now(),
            )
        ).rowcount)

    # -- the gauges ----------------------------------------------------------------------
    def retention_path(self, conn: Connection) -> AbstractContextManager[None]:
        raise NotImplementedError  # each dialect's store opens it its own way

    def purge(
        self,
        conn: Connection,
        periods: retention.RetentionPeriods,
        *,
        now: datetime | None = None,
        dry_run: bool = False,
        limit: int = retention.DEFAULT_LIMIT,
        actor: str = retention.ACTOR,
    ) -> retention.PurgeCounts:
        return retention.purge(conn, periods, retention_path=self.retention_path, now=now,
                               dry_run=dry_run, limit=limit, actor=actor)

    def erase_tenant(
        self, conn: Connection, tenant_id: str, *, actor: str, reason: str, dry_run: bool = False
    ) -> retention.EraseCounts:
        return retention.erase_tenant(conn, tenant_id, retention_path=self.retention_path,
                                      actor=actor, reason=reason, dry_run=dry_run)

    def count_by_status(
        self, conn: Connection, statuses: Sequence[OperationStatus]
    ) -> dict[str, int]:
        rows = conn.execute(count_statement(statuses)).all()
        found = {str(status): int(n) for status, n in rows}
        return {s.value: found.get(s.value, 0) for s in statuses}

    def blocked_by_reason(self, conn: Connection) -> dict[str, int]:
        rows = conn.execute(blocked_statement()).all()
        return {str(reason or "unspecified"): int(n) for reason, n in rows}

    def oldest_due_pending_age(self, conn: Connection) -> float:
        retry_at, created, now = conn.execute(oldest_due_pending_statement()).one()
        due_since: list[datetime] = [t for t in (retry_at, created) if t is not None]
        if not due_since:
            return 0.0
        return max(0.0, float((now - min(due_since)).total_seconds()))


# -- the gauges' statements (each answered from an index bounded by the backlog) --------
def count_statement(statuses: Sequence[OperationStatus]) -> Any:
    """``(status, count)`` for ``statuses``: one part per index that holds them — pending
    rows from the partial pending index, leased rows from the partial lease index, rows
    at rest from the partial status index (:func:`outbox.schema.at_rest`)."""
    values = [s.value for s in statuses]
    pending = [v for v in values if v == S.PENDING.value]
    leased = [v for v in values if v in (S.CLAIMED.value, S.DISPATCHING.value)]
    resting = [v for v in values if v not in schema.ON_THE_PATH]
    parts = [
        sa.select(ops.c.status, sa.func.count()).where(where).group_by(ops.c.status)
        for group, where in (
            (pending, ops.c.status == S.PENDING.value),
            (leased, sa.and_(ops.c.status.in_(leased), ops.c.lease_expires_at.isnot(None))),
            (resting, sa.and_(ops.c.status.in_(resting), schema.at_rest())),
        )
        if group
    ]
    return parts[0] if len(parts) == 1 else sa.union_all(*parts)


def blocked_statement() -> sa.Select[Any]:
    return (
        sa.select(ops.c.status_reason, sa.func.count())
        .where(ops.c.status == S.BLOCKED.value, schema.at_rest())
        .group_by(ops.c.status_reason)
    )


def oldest_due_pending_statement() -> sa.Select[Any]:
    pending = ops.c.status == S.PENDING.value
    next_retry = (
        sa.select(ops.c.next_attempt_at)
        .where(pending, ops.c.next_attempt_at.isnot(None))
        .order_by(ops.c.next_attempt_at, ops.c.id)
        .limit(1)
        .scalar_subquery()
    )
    first_new = (
        sa.select(ops.c.created_at)
        .where(pending, ops.c.next_attempt_at.is_(None))
        .order_by(ops.c.next_attempt_at, ops.c.id)
        .limit(1)
        .scalar_subquery()
    )
    return sa.select(next_retry, first_new, db_now())


def _still(row: OperationRecord, status: OperationStatus) -> Any:
    """The row as it was read: same revision, still ``status``."""
    return sa.and_(ops.c.id == row.id, ops.c.state_revision == row.state_revision,
                   ops.c.status == status.value)


def budgeted_task(task: Mapping[str, Any]) -> bool:
    """A task with an attempt or elapsed-time budget of its own."""
    return task["max_attempts"] is not None or task["max_elapsed_seconds"] is not None
