"""The dispatch cycle of one replica: claim -> check -> commit ``dispatching`` -> send ->
record. Each step is a method the daemon's loop calls; nothing here sleeps or loops.

Order is the protocol: a request leaves the process only after the transaction that
moved its row to ``dispatching`` has committed, and every later write is fenced on the
batch's token and the row's revision. Sends run on up to ``concurrency`` send threads
(:mod:`dispatcher.engine.senders`); their outcomes are recorded in batches — on PostgreSQL
by a recording thread on a connection of its own, while this thread claims the next batch.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import AbstractContextManager, contextmanager, suppress
from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from dispatcher.engine import failpoints, leases, outcomes, recording
from dispatcher.engine.checks import AuthorityCheck, NoAuthority, pre_dispatch, scan_stored
from dispatcher.engine.recording import InFlight, decide, observe, recorded
from dispatcher.engine.senders import SendThreads
from dispatcher.engine.settings import WorkerSettings
from dispatcher.observability import metrics
from dispatcher.observability.tracing import Tracing
from dispatcher.store import direct, journal, store_for
from dispatcher.store.transitions import Dispatching, Recorded, Transition
from outbox.protection.artifacts import ArtifactStore
from outbox.records import OperationRecord
from outbox.states import OperationStatus
from providers.base import Dispatch, Outcome, OutcomeKind, Provider, TransportPhase

log = logging.getLogger("outboxd.dispatch")
RECORD_LINGER_SECONDS = 0.01
IDLE_IN_TRANSACTION_TIMEOUT = "25P03"
"""PostgreSQL's SQLSTATE when it ends a session idle in a transaction past its timeout."""
KEEP_FROM_POOL_SIZE = 2
"""The smallest ``pool_size`` with which the claiming and recording threads keep their
connections (up to twice ``pool_size`` are open: two kept leave at least two)."""
S = OperationStatus


class _TwoSteps(Exception):
    """A batch claimed and marked in one statement holds a row that is refused: its
    transaction is rolled back, and the batch is taken again in two steps."""


def _pool_size(engine: Engine) -> int:
    size = getattr(engine.pool, "size", None)
    return int(size()) if callable(size) else 0


class Worker:
    def __init__(
        self,
        engine: Engine,
        providers: Mapping[str, Provider],
        settings: WorkerSettings,
        authority: AuthorityCheck | None = None,
        artifacts: ArtifactStore | None = None,
        *,
        tracing: Tracing | None = None,
    ) -> None:
        self.engine = engine
        self.tracing = tracing or Tracing()
        # PostgreSQL: the claim and the record are each ONE statement, so they run as their
        # own transaction (autocommit: no BEGIN/COMMIT round trips); SQLite's claim is
        # several statements under BEGIN IMMEDIATE.
        self.store = store_for(engine.dialect.name)
        self._one_statement = (
            engine.execution_options(isolation_level="AUTOCOMMIT")
            if engine.dialect.name == "postgresql"
            else engine
        )
        self.providers = providers
        self.s = settings
        self.authority: AuthorityCheck = authority or NoAuthority()
        self.artifacts = artifacts
        self.kick = threading.Event()
        self.claimed_short = False
        """The last claim took fewer rows than it asked for: nothing else was eligible when it
        ran, so the next one can wait for a wake-up (a new row's NOTIFY, a finished send, a
        record, the poll interval) instead of following at once."""
        self._pool = SendThreads(settings.concurrency, "outboxd-send")
        self._inflight: dict[int, InFlight] = {}
        self._done: queue.SimpleQueue[InFlight] = queue.SimpleQueue()
        self._unrecorded: list[InFlight] = []
        self._oldest_done: float | None = None
        # PostgreSQL: the record statement runs on a thread of its own, on its own
        # connection, while this thread claims the next batch (the record is one
        # self-committing statement fenced on token and revision, so running it beside the
        # next claim changes no ordering the protocol relies on). SQLite has one writer.
        self._recorder = (
            ThreadPoolExecutor(1, thread_name_prefix="outboxd-record")
            if self._one_statement is not self.engine
            else None
        )
        self._recording: tuple[Future[set[int]], list[InFlight]] | None = None
        # PostgreSQL: each thread that runs self-committing statements (this one, the
        # recording thread) keeps its connection between batches instead of taking it from
        # the pool and returning it around every statement; dropped on any error
        # (only with a pool of two or more: a pool of one, with as many again in overflow,
        # would leave nothing for lease extension, maintenance and the gauges)
        self._keep = self._recorder is not None and _pool_size(engine) >= KEEP_FROM_POOL_SIZE
        self._kept = threading.local()
        self._kept_all: list[Connection] = []
        self._kept_lock = threading.Lock()

    # -- claim and dispatch ------------------------------------------------------------
    def free_slots(self) -> int:
        """Send slots free: ``concurrency`` less the sends not yet recorded, not counting
        those the recording thread is writing (their requests are done), so a batch can be
        claimed and sent while the one before it is recorded."""
        return self.s.concurrency - len(self._inflight) + self._being_recorded()

    def _being_recorded(self) -> int:
        return len(self._recording[1]) if self._recording is not None else 0

    def in_flight(self) -> int:
        return len(self._inflight)

    def _batch(self) -> int:
        return max(1, min(self.s.batch_size, self.s.concurrency))

    def claim_and_dispatch(self) -> int:
        """Claim one batch and send what passes the checks. Returns rows claimed.

        Claims only when at least half a batch of send slots is free (or nothing is in
        flight), so batches stay large. Claim, checks and mark are ONE transaction: the
        claim holds its rows (PostgreSQL: ``FOR UPDATE SKIP LOCKED``; SQLite: the one
        writer's ``BEGIN IMMEDIATE``) instead of committing them as ``claimed``, and the
        mark (and each refusal) moves them on in it, so its commit is the ``dispatching``
        commit — nothing leaves the process before it. One row update and one commit fewer
        per batch than a committed claim; a crash before the commit leaves the rows
        ``pending`` with no lease to wait out. On PostgreSQL a worker that stalls holding
        them loses its session after ``lease_seconds`` (the claim sets the transaction's
        ``idle_in_transaction_session_timeout``), as a committed claim's lease would end."""
        free = self.free_slots()
        if free <= 0 or (self._inflight and free < self._batch() // 2):
            return 0
        limit = min(self.s.batch_size, free)
        try:
            taken = self._take(limit, one_statement=True) if self.store.marks_in_claim else None
            if taken is None:
                taken = self._take(limit, one_statement=False)
                assert taken is not None  # the two steps refuse rows, never the batch
        except sa.exc.DBAPIError as exc:
            if getattr(exc.orig, "sqlstate", None) != IDLE_IN_TRANSACTION_TIMEOUT:
                raise
            log.warning("a claim held past its lease was ended by the server; "
                        "nothing was sent, its rows are pending again",
                        extra={"worker": self.s.worker_id})
            return 0
        claimed, sends = taken
        self.claimed_short = claimed < limit
        if not claimed:
            return 0
        failpoints.hit("after_dispatching_commit")
        for item in sends:
            self._inflight[item.op.id] = item
            self._pool.submit(self._send, item)
        return claimed

    def _take(self, limit: int, *, one_statement: bool) -> tuple[int, list[InFlight]] | None:
        """One batch claimed (held), checked and marked in one transaction: rows claimed
        and the sends to make. ``one_statement``: claimed and marked by one statement
        (:meth:`Store.claim_and_mark`), then checked; ``None`` when a row is refused (by
        the statement or by the checks) — the transaction is rolled back, nothing of it
        stays, and the caller takes the batch in two steps (claim, checks, then the mark
        and the refusals), which refuse the row with its reason."""
        t0 = time.perf_counter()
        sent_at = time.monotonic()
        try:
            # one statement: the claim opens the transaction itself (BEGIN in its round
            # trip, where the connection prepares statements server-side)
            held = (self._explicit_transaction(begun=True) if one_statement
                    else self._held_transaction())
            with held as conn:
                marks = None
                if one_statement:
                    got = self.store.claim_and_mark(
                        conn, worker=self.s.worker_id, limit=limit,
                        lease_seconds=self.s.lease_seconds, begin=True,
                    )
                    if got is None:
                        raise _TwoSteps
                    (token, rows, task_rows), marks = got
                else:
                    token, rows, task_rows = self.store.claim(
                        conn, worker=self.s.worker_id, limit=limit,
                        lease_seconds=self.s.lease_seconds, held=True,
                    )
                metrics.CLAIM_DURATION.observe(time.perf_counter() - t0)
                if not rows:
                    return 0, []
                failpoints.hit("after_claim_commit")  # held: nothing committed yet
                # the database clock from here on, without a round trip: the claim
                # statement's time (every claimed row's updated_at) plus the time since the
                # claim was sent, never less than the true database time (a deadline or a
                # window ends no later)
                claimed_at = max(r.updated_at for r in rows)
                sends = self._commit_dispatching(
                    token, rows, task_rows,
                    lambda: claimed_at + timedelta(seconds=time.monotonic() - sent_at),
                    conn, marks=marks,
                )
        except _TwoSteps:
            return None
        return len(rows), sends

    def _held_transaction(self) -> AbstractContextManager[Connection]:
        """The transaction a held claim runs in: committed when the block ends, rolled
        back when it raises. SQLite: one ``BEGIN IMMEDIATE`` transaction (the one writer).
        PostgreSQL: this thread's kept autocommit connection inside an explicit one."""
        if self._one_statement is self.engine:
            return self.engine.begin()
        return self._explicit_transaction()

    @contextmanager
    def _explicit_transaction(self, *, begun: bool = False) -> Iterator[Connection]:
        """This thread's connection (:meth:`_own_connection`, autocommit) inside one
        explicit transaction: committed when the block ends, rolled back (if the
        connection still can) when it raises. ``begun``: the block's first statement
        opens the transaction itself (``claim_and_mark(begin=True)``)."""
        with self._own_connection() as conn:
            if not begun:
                direct.run(conn, "BEGIN")
            try:
                yield conn
            except _TwoSteps:
                direct.run(conn, "ROLLBACK")  # if this fails, the connection is dropped
                raise
            except BaseException:
                if not conn.invalidated:
                    with suppress(Exception):  # the connection is dropped either way
                        direct.run(conn, "ROLLBACK")
                raise
            direct.run(conn, "COMMIT")

    def _commit_dispatching(
        self,
        token: int,
        rows: list[OperationRecord],
        task_rows: Mapping[tuple[str, str], Mapping[str, Any]],
        db_clock: Callable[[], datetime],
        conn: Connection,
        *,
        marks: list[Dispatching] | None = None,
    ) -> list[InFlight]:
        """The checks and the ``dispatching`` mark of one claimed batch, in ``conn``: the
        transaction of its held claim, which the rows are marked (or refused) in.
        ``marks``: the batch is marked already (:meth:`Store.claim_and_mark`); a refusal
        raises :class:`_TwoSteps`."""
        refused: list[Transition] = []
        details: dict[int, Mapping[str, Any]] = {}
        by_id = {r.id: r for r in rows}
        # read before the statement that sets the lease: the lease on the database clock
        # cannot end before this reading + lease_seconds
        lease_until = time.monotonic() + self.s.lease_send_seconds
        # one transaction with the claim: the locks the checks take hold until the mark
        # commits; where nothing locks, the checks use the task rows the claim read
        self.authority.needs_lock(rows, task_rows)
        now = db_clock()
        passing: list[OperationRecord] = []
        digests: dict[int, str | None] = {}
        payloads: dict[int, Mapping[str, Any] | None] = {}
        scans = scan_stored(rows)
        for op in rows:
            v = pre_dispatch(
                op,
                providers=self.providers,
                margin=self.s.dedup_safety_margin,
                max_payload_bytes=self.s.max_payload_bytes,
                now=now,
                artifacts=self.artifacts,
                protection=self.s.protection,
                scanned=scans.get(op.id),
            )
            digests[op.id] = v.digest
            payloads[op.id] = v.payload
            if v.status is None:
                passing.append(op)
                continue
            if v.detail:
                details[op.id] = {"detail": v.detail}
            refused.append(
                Transition(
                    op.id, op.state_revision, v.status, v.reason, payload_digest=v.digest
                )
            )
            if v.dedup_refused:
                metrics.DEDUP_WINDOW_REFUSALS.labels(op.provider).inc()
        as_sent = [
            # what is sent: a resolved artifact, or an opened envelope
            replace(op, payload=p) if (p := payloads[op.id]) is not op.payload else op
            for op in passing
        ]
        for op_id, reason in self.authority.check(conn, as_sent, now).items():
            op = by_id[op_id]
            # an earlier attempt may have landed: reconcile it rather than block it
            status = S.UNKNOWN if outcomes.blind(op.last_outcome) else S.BLOCKED
            detail = getattr(reason, "detail", None)
            if detail:
                details[op.id] = detail
            refused.append(
                Transition(
                    op.id,
                    op.state_revision,
                    status,
                    str(reason),
                    payload_digest=digests.get(op.id),
                )
            )
        if marks is not None:
            if refused:
                raise _TwoSteps
            marked = marks
            late = {}
        else:
            blocked_ids = {t.id for t in refused}
            passing = [op for op in passing if op.id not in blocked_ids]
            marked = self.store.mark_dispatching(
                conn,
                token=token,
                pairs=[(op.id, op.state_revision) for op in passing],
                lease_seconds=self.s.lease_seconds,
                actor=self.s.worker_id,
                held=True,
            )
            marked_ids = {m.id for m in marked}
            late = self.store.refusal_reasons(
                conn, [op.id for op in passing if op.id not in marked_ids], held=True
            )
        for op_id, (late_status, reason) in late.items():
            op = by_id[op_id]
            # an earlier attempt may have landed: reconcile it before anything else
            blind = late_status == S.BLOCKED and outcomes.blind(op.last_outcome)
            refused.append(
                Transition(
                    op.id, op.state_revision, S.UNKNOWN if blind else late_status, reason
                )
            )
        moved = self._write_refusals(conn, token, refused, by_id, details)
        sends = []
        for m in marked:
            op = by_id[m.id]
            sends.append(
                InFlight(
                    op,
                    token,
                    m.state_revision,
                    m.attempts,
                    m.first_dispatched_at,
                    m.last_attempt_started_at,
                    digests.get(op.id),
                    payload=payloads.get(op.id),
                    send_by=recording.send_deadline(
                        self.providers[op.provider].capabilities, self.s, op,
                        m.first_dispatched_at, m.last_attempt_started_at,
                    ),
                    lease_until=lease_until,
                )
            )
        self.authority.consume(conn, [by_id[m.id] for m in marked], token)
        lost = len(rows) - len(marked) - len(moved)
        if lost:
            metrics.FENCING_REJECTIONS.inc(lost)
        for t in refused:
            if t.id in moved:
                log.warning(
                    "operation not dispatched",
                    extra={
                        "operation_id": by_id[t.id].operation_id,
                        "tenant": by_id[t.id].tenant_id,
                        "status": t.status.value,
                        "reason": t.status_reason,
                        "fencing_token": token,
                    },
                )
        return sends

    def _write_refusals(
        self,
        conn: Connection,
        token: int,
        refused: list[Transition],
        by_id: Mapping[int, OperationRecord],
        details: Mapping[int, Mapping[str, Any]],
    ) -> set[int]:
        """``claimed ->`` each refused row's status (fenced on the held claim's
        transaction), with its event. Returns the ids moved."""
        moved = self.store.transition_many(
            conn, token=token, expected=S.CLAIMED, items=refused, held=True
        )
        journal.write(
            conn,
            [
                journal.event(
                    by_id[t.id],
                    from_status="claimed",
                    to_status=t.status.value,
                    reason=t.status_reason,
                    actor=self.s.worker_id,
                    fencing_token=token,
                    detail=details.get(t.id),
                )
                for t in refused
                if t.id in moved
            ],
        )
        return moved

    def _send(self, item: InFlight) -> None:
        provider = self.providers[item.op.provider]
        op = item.op
        refusal = recording.not_sent_outcome(item, time.monotonic())
        if item.lease_lost and leases.renew_before_send(self.engine, item, self.s):
            item.lease_lost, refusal = False, None  # still ours, for a lease from now
        if refusal is not None:
            item.outcome = refusal
            if item.lease_lost:
                log.warning("send refused: the lease ended before the request left",
                            extra={"operation_id": op.operation_id, "tenant": op.tenant_id,
                                   "fencing_token": item.token})
            self._finish(item)
            return
        failpoints.hit("before_write")
        payload = item.payload if item.payload is not None else op.payload
        if not isinstance(payload, Mapping):  # admission refuses these; never sent as {}
            payload = {}
        span = (None if self.tracing.tracer is None else
                self.tracing.start(op, provider=op.provider, token=item.token,
                                   attempt=item.attempt))
        dispatch = Dispatch(
            tenant_id=op.tenant_id,
            task_id=op.task_id,
            operation_id=op.operation_id,
            idempotency_key=op.idempotency_key or f"{op.tenant_id}:{op.operation_id}",
            fencing_token=item.token,
            payload=payload,
            attempt=item.attempt,
            payload_digest=item.digest,
            traceparent=op.traceparent if span is None else span.traceparent,
            created_at=op.created_at,
        )
        t0 = time.perf_counter()
        try:
            item.outcome = provider.send(dispatch)
        except Exception as exc:  # a provider bug must not lose the row: it may have sent
            log.exception("provider raised", extra={"operation_id": op.operation_id})
            item.outcome = Outcome(
                OutcomeKind.AMBIGUOUS,
                error_class=type(exc).__name__,
                transport_phase=TransportPhase.AFTER_WRITE,
                reason="provider raised",
            )
        item.duration = time.perf_counter() - t0
        if span is not None:
            span.end(item.outcome)
        metrics.duration_series(op.provider).observe(item.duration)
        self._finish(item)

    def _finish(self, item: InFlight) -> None:
        if self._oldest_done is None:
            self._oldest_done = time.monotonic()
        self._done.put(item)
        # set only if clear (``set`` takes the event's lock and wakes its waiters: 0.5 µs a
        # send): the loop clears it before its next cycle, which reads the queue this
        # outcome is on already
        if not self.kick.is_set():
            self.kick.set()

    # -- record ------------------------------------------------------------------------
    def has_done(self) -> bool:
        return bool(self._unrecorded) or not self._done.empty() or self._recording is not None

    def record_due(self) -> bool:
        """Is it time to record? Once the oldest finished send has waited
        ``RECORD_LINGER_SECONDS`` (so one slow send never holds the others' records back
        for long). Before that, not while the loop is working through a backlog with room
        for another full batch (its last claim came back full, and a batch's slots are
        free): finished sends then wait, holding their slots, until the slots run short,
        so one record — one statement and one commit on PostgreSQL — takes the sends of
        several claimed batches. Otherwise when a batch has finished or every send in
        flight has. The outcomes of a record that failed are due at once."""
        if self._unrecorded:  # a failed record's outcomes: written at the next chance
            return True
        done = self._done.qsize()
        if done == 0:
            return False
        oldest = self._oldest_done
        if oldest is not None and time.monotonic() - oldest >= RECORD_LINGER_SECONDS:
            return True
        if not self.claimed_short and self.free_slots() >= self._batch():
            return False
        return done >= len(self._inflight) - self._being_recorded() or done >= self._batch()

    def record_done(self, *, force: bool = False) -> int:
        """Record finished sends (when due, or ``force``). Returns how many were recorded,
        handed to the recording thread, or collected from it (slots freed).

        With a recording thread (PostgreSQL) and without ``force``, the batch is handed to
        it and this returns at once; a record still running is waited for only by the
        next ``force``. With ``force`` (shutdown, tests) everything is recorded before
        this returns. A failed record raises here, on the next call, and its outcomes are
        kept to be recorded once the database is back."""
        handed = self._collect(wait=force)  # first: its slots are free for this claim
        if self._recording is not None:  # still running: one record at a time
            return handed
        if not force and not self.record_due():
            return handed
        items = self._take_done()
        if not items:
            return handed
        if self._recorder is not None and not force:
            self._recording = (self._recorder.submit(self._record_batch, items), items)
            return handed + len(items)
        try:
            moved = self._record_batch(items)
        except Exception:
            self._unrecorded = items  # recorded once the database is back
            raise
        self._recorded(items, moved)
        return handed + len(items)

    def _take_done(self) -> list[InFlight]:
        items = self._unrecorded
        self._unrecorded = []
        while True:
            try:
                items.append(self._done.get_nowait())
            except queue.Empty:
                break
        self._oldest_done = None
        return items

    def _collect(self, *, wait: bool) -> int:
        """The record running on the recording thread: when it has finished (or ``wait``),
        its result — a failure is raised, its outcomes kept for the next record."""
        if self._recording is None:
            return 0
        future, items = self._recording
        if not wait and not future.done():
            return 0
        self._recording = None
        try:
            moved = future.result()
        except Exception:
            self._unrecorded = items + self._unrecorded
            raise
        self._recorded(items, moved)
        return len(items)

    def _record_batch(self, items: list[InFlight]) -> set[int]:
        """Write the outcomes (on the recording thread, or this one); the ids moved."""
        try:
            failpoints.hit("after_send")
            return self._record(items)
        finally:
            self.kick.set()  # the dispatch loop collects the result

    def _recorded(self, items: list[InFlight], moved: set[int]) -> None:
        """A record has committed: its sends leave the in-flight set (this thread only)."""
        for item in items:
            self._inflight.pop(item.op.id, None)
        fenced = len(items) - len(moved)
        if fenced:
            metrics.FENCING_REJECTIONS.inc(fenced)
            log.warning("stale outcomes not applied (fencing)", extra={"count": fenced})

    def _transaction(self) -> AbstractContextManager[Connection]:
        """A transaction for one statement (PostgreSQL: the statement is its own)."""
        if self._one_statement is self.engine:
            return self.engine.begin()
        return self._own_connection()

    @contextmanager
    def _own_connection(self) -> Iterator[Connection]:
        """This thread's autocommit connection (PostgreSQL), kept between statements; on
        any error it is closed (back to the pool, or discarded if it was lost) and the next
        statement takes another. With a pool too small to spare one, a connection from the
        pool for each statement."""
        if not self._keep:
            with self._one_statement.connect() as fresh:
                yield fresh
            return
        conn: Connection | None = getattr(self._kept, "conn", None)
        if conn is None or conn.closed or conn.invalidated:
            conn = self._one_statement.connect()
            self._kept.conn = conn
            with self._kept_lock:
                self._kept_all.append(conn)
        try:
            yield conn
        except _TwoSteps:
            raise  # rolled back: the connection stays
        except BaseException:
            self._kept.conn = None
            self._drop(conn)
            raise

    def _drop(self, conn: Connection) -> None:
        with self._kept_lock:
            if conn in self._kept_all:
                self._kept_all.remove(conn)
        try:
            conn.close()
        except Exception:  # already lost: the pool has discarded it
            log.debug("closing a lost connection failed", exc_info=True)

    def _record(self, items: list[InFlight]) -> set[int]:
        """One record of finished sends, of one claimed batch or several: on PostgreSQL
        one self-committing statement, each row fenced on its own batch's token."""
        worker = self.s.worker_id
        decided: list[tuple[InFlight, outcomes.Decision, Recorded]] = []
        for item in items:
            now = item.db_now()
            d = decide(item, self.providers, self.s, now)
            decided.append((item, d, recorded(item, d, worker, now)))
        with self._transaction() as conn:
            if self._one_statement is not self.engine:  # the write commits as it runs
                failpoints.hit("before_receipt_commit")
            moved = self.store.record_many(
                conn, items=[r for _, _, r in decided], actor=worker)
            for item, d, _ in decided:
                observe(item, d, moved=item.op.id in moved)
            if self._one_statement is self.engine:
                failpoints.hit("before_receipt_commit")
        return moved

    # -- leases and shutdown -------------------------------------------------------------
    def extend_leases(self) -> None:
        """Renew the leases of sends that outlive a third of their lease."""
        leases.extend(self.engine, list(self._inflight.values()), self.s)

    def wait_in_flight(self, timeout: float) -> None:
        """Wait up to ``timeout`` for sends in flight, recording what finishes."""
        deadline = time.monotonic() + timeout
        while (self._inflight or self._recording) and time.monotonic() < deadline:
            self.kick.wait(min(0.05, max(0.0, deadline - time.monotonic())))
            self.kick.clear()
            self.record_done(force=True)

    def close(self) -> None:
        self._pool.shutdown()
        if self._recorder is not None:
            self._recorder.shutdown(wait=True)
        with self._kept_lock:
            kept, self._kept_all = self._kept_all, []
        for conn in kept:  # every thread that used one has stopped
            self._drop(conn)

