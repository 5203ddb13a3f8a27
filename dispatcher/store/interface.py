"""The store: every hot-path statement the dispatcher runs, as one typed interface.

Two implementations, one per dialect, each in a module of its own:
:class:`dispatcher.store.postgres.PostgresStore` (each protocol step is one statement that
also writes its events, ``FOR UPDATE SKIP LOCKED`` claims, fencing tokens from a sequence)
and :class:`dispatcher.store.sqlite.SQLiteStore` (the caller's ``BEGIN IMMEDIATE`` makes
the dispatcher the one writer; events written beside each statement). What both write the
same way — predicates, SET clauses, the statements whose text is the same on both — is in
:mod:`dispatcher.store.common`, written once. ``tests/store`` runs one conformance suite
against both.

Fencing: one claim takes one fresh value of the fencing counter for the whole batch, so
every later write of that batch is ``WHERE (id, state_revision) IN (...) AND
fencing_token = :token AND status = :expected``. A write that matches no row is a fencing
rejection: another worker (or lease recovery) moved the row on. Times are on the database
clock (:class:`outbox.types.db_now`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from contextlib import AbstractContextManager
from datetime import datetime
from typing import Any, Protocol

from sqlalchemy.engine import Connection

from dispatcher.store.retention import (
    ACTOR,
    DEFAULT_LIMIT,
    EraseCounts,
    PurgeCounts,
    RetentionPeriods,
)
from dispatcher.store.transitions import Claimed, Dispatching, Recorded, Transition
from outbox.records import OperationRecord
from outbox.states import OperationStatus


class Store(Protocol):
    dialect: str
    """The SQLAlchemy dialect name the store's statements are written for."""

    def fencing_token(self, conn: Connection) -> int:
        """A fresh value of the monotonic fencing counter: higher than every value
        handed out before, on PostgreSQL after a failover too."""
        ...

    def claim(
        self,
        conn: Connection,
        *,
        worker: str,
        limit: int,
        lease_seconds: float,
        held: bool = False,
    ) -> Claimed:
        """``pending -> claimed`` for up to ``limit`` eligible rows (due, task not
        cancelled, first in line for their ordering key), oldest first, with a lease on
        the database clock, one fresh fencing token for the batch, and their events;
        with the rows' task rows (their versions and budgets), read by the same statement
        on PostgreSQL. Token 0 and no rows when nothing is eligible.

        ``held`` (the caller's transaction goes on to mark; the dispatcher's claim):
        the rows are held, not moved — they stay ``pending`` in storage, held by the
        transaction's row locks (PostgreSQL) or its write lock (SQLite's ``BEGIN
        IMMEDIATE``), and are returned as the claim would have left them, their
        revision as stored; the events are written. The same transaction's
        :meth:`mark_dispatching` and :meth:`transition_many` with ``held`` move them on,
        and they set the token. A claim that never commits leaves no trace: the rows are
        ``pending`` again for any worker, with no lease to wait out."""
        ...

    marks_in_claim: bool
    """:meth:`claim_and_mark` moves a batch in one statement (PostgreSQL)."""

    def claim_and_mark(
        self, conn: Connection, *, worker: str, limit: int, lease_seconds: float,
        begin: bool = False,
    ) -> tuple[Claimed, list[Dispatching]] | None:
        """The held claim (:meth:`claim` with ``held``) and its :meth:`mark_dispatching`
        as ONE statement, for a batch the caller expects to pass its checks: up to
        ``limit`` eligible rows move ``pending -> dispatching`` under one fresh token,
        with both events per row (``pending -> claimed``, ``claimed -> dispatching``).
        Returns the claim — each row as the held claim shows it (``claimed``, revision,
        attempts and start times as stored before) — and each row's mark. ``None`` when
        a row it locked could not be marked (its own or its task's deadline has passed):
        the caller rolls the transaction back and takes the two steps, which say why. A
        caller whose checks refuse a row rolls back too: nothing of the statement stays.
        ``begin``: ``conn`` is in autocommit with no transaction open, and the statement
        opens it (``BEGIN``) — in the same round trip where the connection prepares
        statements server-side (:func:`dispatcher.store.direct.begin_and_fetch`)."""
        ...

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
        """``claimed -> dispatching`` ("dispatch may have occurred") for the (id, revision)
        pairs still claimed under ``token``, with their events: counts the attempt, sets
        ``first_dispatched_at`` once, renews the lease. Rows whose own or task deadline has
        passed on the database clock, or whose task was cancelled, are left claimed and
        absent from the result (:meth:`refusal_reasons` says why). ``held``: the rows of
        a held claim in this transaction."""
        ...

    def transition_many(
        self,
        conn: Connection,
        *,
        token: int,
        expected: OperationStatus,
        items: Sequence[Transition],
        held: bool = False,
    ) -> set[int]:
        """Move rows on from ``expected``, each fenced on (id, token, revision, status),
        without events (the caller writes them). Returns the ids moved. ``held``: rows of
        a held claim in this transaction, shown ``expected`` (claimed), stored
        ``pending``."""
        ...

    def record_many(
        self, conn: Connection, *, items: Sequence[Recorded], actor: str
    ) -> set[int]:
        """Record finished sends, of one claimed batch or several: ``dispatching ->`` each
        row's next status, fenced on the item's own token (:attr:`Recorded.token`), an
        event per row moved, an attempt row per send (marked ``fenced`` when its write
        matched nothing). Returns the ids moved."""
        ...

    def extend_leases(
        self,
        conn: Connection,
        *,
        token: int,
        pairs: Sequence[tuple[int, int]],
        lease_seconds: float,
    ) -> set[int]:
        """Renew the lease of rows still ``dispatching`` under ``token`` (not a
        transition: the revision is unchanged). Returns the ids extended."""
        ...

    def refusal_reasons(
        self, conn: Connection, ids: Sequence[int], held: bool = False
    ) -> dict[int, tuple[OperationStatus, str]]:
        """Why claimed rows were not marked: ``(cancelled, task_cancelled)`` or
        ``(blocked, deadline_passed)``. Rows absent from the result lost their lease."""
        ...

    def db_now(self, conn: Connection) -> datetime:
        """The database clock."""
        ...

    # -- the repair paths ----------------------------------------------------------------
    def expired_leases(self, conn: Connection, *, limit: int) -> list[OperationRecord]:
        """Leased rows (``claimed``, ``dispatching``) whose lease has passed on the
        database clock, oldest lease first (PostgreSQL: skipping rows another transaction
        holds)."""
        ...

    def recover_leases(
        self, conn: Connection, rows: Sequence[OperationRecord]
    ) -> list[OperationRecord]:
        """Expired ``claimed -> pending`` (never sent); expired ``dispatching -> unknown``
        (may have been sent: never ``pending``), each conditional on the revision read and
        a lease still expired, so a worker that extended its lease in time keeps it.
        Returns the rows moved, as they are now (events are the caller's)."""
        ...

    def unknown_due(self, conn: Connection, *, limit: int) -> list[OperationRecord]:
        """``unknown`` rows whose next look-up is due."""
        ...

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
        """Move an ``unknown`` row on from reconciliation evidence, conditional on the
        revision read (a concurrent reconciler or operator wins). True if it moved."""
        ...

    def look_again(self, conn: Connection, *, row: OperationRecord, delay_seconds: float) -> None:
        """Keep a row ``unknown`` and schedule its next look-up (not a transition)."""
        ...

    # -- the verifier, the cluster's jobs, the gauges --------------------------------------
    def publish_verifiers(self, conn: Connection, verifies: Mapping[str, bool]) -> None:
        """Record which configured providers verify (``outbox_meta`` rows
        ``verifier:NAME``, read by :func:`outbox.recovery.plan`)."""
        ...

    def verification_due(
        self, conn: Connection, providers: Sequence[str], *, limit: int
    ) -> list[OperationRecord]:
        """``applied`` rows of these providers whose verification is due (not failed)."""
        ...

    def verify_later(self, conn: Connection, *, row: OperationRecord, delay_seconds: float) -> None:
        """Ask again later (``next_attempt_at`` of an ``applied`` row), on the revision read."""
        ...

    def record_verification(
        self, conn: Connection, *, row: OperationRecord, verified: bool
    ) -> bool:
        """``applied -> verified``, or ``applied`` with ``verification_failed``, on the
        revision read. False when another actor moved the row first."""
        ...

    def replication(self, conn: Connection) -> tuple[int, str, str] | None:
        """The server's physical standbys, ``synchronous_standby_names`` and
        ``synchronous_commit`` (None where there is no replication: SQLite)."""
        ...

    def take_cluster_lock(self, conn: Connection, key: int) -> bool:
        """Whether this transaction now holds the cluster-wide lock ``key`` (False:
        another replica's run does). It ends with the transaction."""
        ...

    def count_by_status(
        self, conn: Connection, statuses: Sequence[OperationStatus]
    ) -> dict[str, int]:
        """Operations per status (0 where none)."""
        ...

    def blocked_by_reason(self, conn: Connection) -> dict[str, int]:
        """``blocked`` operations per reason."""
        ...

    def oldest_due_pending_age(self, conn: Connection) -> float:
        """Seconds the longest-waiting *due* pending operation has waited since it became
        due (its ``next_attempt_at``, or its creation when it has none); 0 when none."""
        ...

    # -- retention -----------------------------------------------------------------------
    def retention_path(self, conn: Connection) -> AbstractContextManager[None]:
        """Open the database rules' retention path for the rest of the block, in the
        caller's transaction (the only way a purge may change evidence)."""
        ...

    def purge(
        self,
        conn: Connection,
        periods: RetentionPeriods,
        *,
        now: datetime | None = None,
        dry_run: bool = False,
        limit: int = DEFAULT_LIMIT,
        actor: str = ACTOR,
    ) -> PurgeCounts:
        """Apply the retention periods once (:func:`dispatcher.store.retention.purge`)."""
        ...

    def erase_tenant(
        self, conn: Connection, tenant_id: str, *, actor: str, reason: str, dry_run: bool = False
    ) -> EraseCounts:
        """Remove one tenant's bodies and personal data, keeping minimised evidence
        (:func:`dispatcher.store.retention.erase_tenant`)."""
        ...

    # -- the server ----------------------------------------------------------------------
    listen_statement: str | None
    """The statement that subscribes a connection to new-row notifications (PostgreSQL
    ``LISTEN``); None where there are none and the dispatcher polls (SQLite)."""

    def server_port(self, conn: Connection) -> int | None:
        """The port the database server listens on (None: a file, or a Unix socket), to
        tell whether a pooler or proxy sits between the dispatcher and the server."""
        ...

    # -- the authority -------------------------------------------------------------------
    def task_limits(
        self, conn: Connection, pairs: Sequence[tuple[str, str]], *, lock_budgeted: bool
    ) -> dict[tuple[str, str], dict[str, Any]]:
        """The task rows of (tenant, task) pairs: id, workflow version, budgets. With
        ``lock_budgeted``, the tasks with a budget are locked until the transaction ends
        (PostgreSQL; on SQLite the one writer already serialises), so two replicas never
        both spend a task's last attempt."""
        ...

    def task_spending(
        self, conn: Connection, pairs: Sequence[tuple[str, str]]
    ) -> dict[tuple[str, str], tuple[int, datetime | None]]:
        """Per task: attempts so far over its operations, and its first dispatch."""
        ...

    def approvals_for(
        self, conn: Connection, pairs: Sequence[tuple[str, str]]
    ) -> list[dict[str, Any]]:
        """The approval rows of (tenant, operation id) pairs, oldest first, locked until
        the transaction ends on PostgreSQL (a revocation waits for the dispatching mark)."""
        ...

    def consume_approvals(self, conn: Connection, ids: Sequence[int], token: int) -> set[int]:
        """Mark approvals consumed under ``token`` (once: an already consumed one is left
        as it is). Returns the ids consumed now."""
        ...
