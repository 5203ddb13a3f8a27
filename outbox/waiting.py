"""Waiting for an operation's outcome: :func:`wait_for`, the agent's way back to its receipt.

An agent stages "create the ticket", commits, and needs the ticket's id to go on. The
dispatcher is another process; :func:`wait_for` watches the operation's row until it is
*settled* — a state the agent can act on without the dispatcher doing anything more:

* ``applied`` or ``verified``: the effect happened; the record's ``receipt`` says what came
  back (the ticket's id);
* ``rejected``: the receiver refused it for good; ``status_reason`` says why;
* ``cancelled``: the task was cancelled before it was sent;
* ``blocked``: it needs a person (an approval, a budget, a bad payload: ``status_reason``);
* ``unknown``, once it has been unknown for ``unknown_patience`` seconds of this wait: the
  dispatcher reconciles unknown outcomes with the provider on its own, so by default the
  wait goes on; with a patience the agent can decide to escalate instead.

Anything else (``pending``, ``claimed``, ``dispatching``) is in the dispatcher's hands, and
the wait goes on until ``timeout``, when :class:`outbox.errors.WaitTimeout` names the
operation and the state it was last seen in. The row is read in short transactions of the
waiter's own, with a back-off from 20 ms to half a second between reads, so any number of
waiters in any number of processes may wait at once; nothing is written.

On PostgreSQL a read is also woken at once by the notifications the dispatcher's record
step sends for the operations it settles (channel :data:`outbox.ddl.SETTLED_CHANNEL`, sent
by the record statement itself; what one names: :func:`keys_of`): one LISTEN connection
per database per process, opened by the first wait and kept, serves every waiter of the
process. A notification lost while that connection reconnects, or a state reached by
another path (an operator, reconciliation), is found by the next read.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from typing import Final, Protocol

from sqlalchemy.engine import Connection, Engine

from outbox import errors
from outbox.ddl import SETTLED_CHANNEL
from outbox.records import OperationRecord
from outbox.staging import existing_operation
from outbox.states import SETTLED, OperationStatus
from outbox.tenancy import set_tenant

FIRST_POLL_SECONDS: Final = 0.02
MAX_POLL_SECONDS: Final = 0.5
LISTEN_READY_SECONDS: Final = 1.0
"""How long the first wait of a process waits for the LISTEN connection before reading
anyway (later ones never wait for it)."""
log = logging.getLogger("outbox.wait")


def wait_for(
    engine_or_connection: Engine | Connection,
    *,
    tenant_id: str,
    operation_id: str,
    timeout: float,
    unknown_patience: float | None = None,
) -> OperationRecord:
    """Block until the operation is settled (see the module's docstring) and return its
    record; raise :class:`~outbox.errors.WaitTimeout` after ``timeout`` seconds, and
    :class:`~outbox.errors.OperationNotFound` at once for an operation that does not exist.

    Give an ``Engine``, or a ``Connection`` with no transaction open: each read is a short
    transaction of its own, so the dispatcher's commits become visible. Waiting inside an
    open transaction would read one snapshot forever (and on SQLite hold the one write
    lock the dispatcher needs), so that is refused.
    """
    in_tx = isinstance(engine_or_connection, Connection) and engine_or_connection.in_transaction()
    watch = Watch(tenant_id, operation_id, timeout, unknown_patience, in_transaction=in_tx)
    listener = listener_for(engine_or_connection.engine)
    woken = threading.Event()
    if listener is not None:
        listener.register(watch.key, woken)
        listener.tried.wait(LISTEN_READY_SECONDS)  # only the first waiters wait at all
    try:
        while True:
            woken.clear()  # before the read: a notification from here on wakes the next wait
            op = _read(engine_or_connection, tenant_id, operation_id)
            if watch.settled(op):
                return op
            woken.wait(watch.pause())
    finally:
        if listener is not None:
            listener.unregister(watch.key, woken)


class Watch:
    """One wait's arithmetic, shared by :func:`wait_for` and :func:`outbox.aio.wait_for`:
    what is settled, the unknown patience, the timeout and the back-off between reads."""

    def __init__(self, tenant_id: str, operation_id: str, timeout: float,
                 unknown_patience: float | None, *, in_transaction: bool) -> None:
        if timeout < 0 or (unknown_patience is not None and unknown_patience < 0):
            raise errors.InvalidPayload("timeout and unknown_patience must be >= 0 seconds",
                                        timeout=timeout, unknown_patience=unknown_patience)
        if in_transaction:
            raise errors.OutboxError(
                "wait_for reads in transactions of its own: commit first, then wait with the "
                "engine or a connection outside a transaction",
                tenant_id=tenant_id, operation_id=operation_id)
        self.key = (tenant_id, operation_id)
        self.start = time.monotonic()
        self.deadline = self.start + timeout
        self.patience = unknown_patience
        self.unknown_since: float | None = None
        self._pause = FIRST_POLL_SECONDS

    def settled(self, op: OperationRecord) -> bool:
        """Is ``op`` settled for this wait? Raises ``WaitTimeout`` when it is not and the
        time is up."""
        now = time.monotonic()
        if op.status in SETTLED:
            return True
        if op.status is OperationStatus.UNKNOWN:
            self.unknown_since = now if self.unknown_since is None else self.unknown_since
            if self.patience is not None and now - self.unknown_since >= self.patience:
                return True
        else:
            self.unknown_since = None
        if now >= self.deadline:
            raise errors.WaitTimeout(tenant_id=self.key[0], operation_id=self.key[1],
                                     status=op.status.value,
                                     waited_seconds=round(now - self.start, 3))
        return False

    def pause(self) -> float:
        """How long to wait before the next read (a notification ends it sooner)."""
        pause = min(self._pause, max(0.0, self.deadline - time.monotonic()))
        self._pause = min(MAX_POLL_SECONDS, self._pause * 1.5)
        return pause


def _read(target: Engine | Connection, tenant_id: str, operation_id: str) -> OperationRecord:
    if isinstance(target, Engine):
        with target.begin() as conn:
            found = find(conn, tenant_id, operation_id)
    else:
        with target.begin():
            found = find(target, tenant_id, operation_id)
    if found is None:
        raise errors.OperationNotFound(tenant_id=tenant_id, operation_id=operation_id)
    return found


def find(conn: Connection, tenant_id: str, operation_id: str) -> OperationRecord | None:
    """The operation, or None (in ``conn``'s transaction)."""
    set_tenant(conn, tenant_id)
    return existing_operation(conn, tenant_id, operation_id)


class Wakeable(Protocol):
    def set(self) -> None: ...


class Listener:
    """One LISTEN connection (its own thread) for every waiter of this process on one
    database: each notification sets the wakers registered for its operation (a
    ``threading.Event``, or anything with ``set()`` that may be called from this thread).
    ``tried`` is set once the first connection attempt is over, either way."""

    def __init__(self, engine: Engine) -> None:
        self._args = engine.dialect.create_connect_args(engine.url)
        self._lock = threading.Lock()
        self._waiters: dict[tuple[str, str], set[Wakeable]] = {}
        self.ready = threading.Event()
        self.tried = threading.Event()
        threading.Thread(target=self._run, name="outbox-wait-listener", daemon=True).start()

    def register(self, key: tuple[str, str], event: Wakeable) -> None:
        with self._lock:
            self._waiters.setdefault(key, set()).add(event)

    def unregister(self, key: tuple[str, str], event: Wakeable) -> None:
        with self._lock:
            events = self._waiters.get(key)
            if events is not None:
                events.discard(event)
                if not events:
                    del self._waiters[key]

    def _wake(self, key: tuple[str, str] | None) -> None:
        with self._lock:
            groups = self._waiters.values() if key is None else [self._waiters.get(key, set())]
            for event in [e for group in groups for e in group]:
                event.set()

    def _run(self) -> None:
        import psycopg

        cargs, cparams = self._args
        while True:
            try:
                with psycopg.connect(*cargs, **{**cparams, "autocommit": True}) as conn:
                    conn.execute(f"LISTEN {SETTLED_CHANNEL}")
                    self.ready.set()
                    self.tried.set()
                    self._wake(None)  # what settled while nobody listened: read again
                    for note in conn.notifies():
                        keys = keys_of(note.payload)
                        for key in [None] if keys is None else keys:
                            self._wake(key)
            except Exception as exc:  # the server went away: reads go on; listen again
                self.ready.clear()
                self.tried.set()
                log.debug("wait listener reconnecting", extra={"error": type(exc).__name__})
                time.sleep(1.0)


def keys_of(payload: str) -> list[tuple[str, str]] | None:
    """The operations a settled notification names: its payload is a JSON array of
    ``[tenant_id, operation_id]`` pairs (one notification for a record's batch), or one
    such pair (what an earlier dispatcher sends). None when it is neither: every waiter
    then reads again."""
    try:
        value = json.loads(payload)
    except ValueError:
        return None
    if not isinstance(value, list):
        return None
    pairs = value if value and all(isinstance(v, list) for v in value) else [value]
    if not all(len(p) == 2 and all(isinstance(x, str) for x in p) for p in pairs):
        return None
    return [(p[0], p[1]) for p in pairs]


_listeners: dict[str, Listener] = {}
_listeners_lock = threading.Lock()


def listener_for(engine: Engine) -> Listener | None:
    """This process's listener for ``engine``'s database (PostgreSQL only)."""
    if engine.dialect.name != "postgresql":
        return None
    key = engine.url.render_as_string(hide_password=False)
    with _listeners_lock:
        found = _listeners.get(key)
        if found is None:
            found = _listeners[key] = Listener(engine)
    return found
