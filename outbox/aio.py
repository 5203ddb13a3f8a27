"""The agent-side API for asyncio agents: the same functions as :mod:`outbox.api`, awaited.

Each function takes a SQLAlchemy ``AsyncConnection`` or ``AsyncSession`` that **the
caller owns** (``create_async_engine("postgresql+psycopg://…")`` — psycopg's async driver —
or ``"sqlite+aiosqlite:///…"``) and runs the synchronous function of the same name on it
through SQLAlchemy's ``run_sync``: one implementation, so the semantics are the same by
construction — staged in the caller's transaction, never begun, committed, rolled back or
retried here, the same errors. :func:`wait_for` waits without blocking the event loop.

Needs the ``aio`` extra (``pip install 'outboxd[aio]'``: SQLAlchemy's asyncio support and
``aiosqlite``).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import importlib.util
from collections.abc import Awaitable, Callable
from typing import Concatenate, ParamSpec, TypeVar

from sqlalchemy.engine import Connection

from outbox import errors

if importlib.util.find_spec("greenlet") is None:  # SQLAlchemy's asyncio support runs on it
    raise errors.MissingExtra("outbox.aio needs the aio extra: pip install 'outboxd[aio]'")

from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, AsyncSession
from sqlalchemy.orm import Session

from outbox import api, db
from outbox.records import OperationRecord
from outbox.waiting import LISTEN_READY_SECONDS, Watch, find, listener_for

__all__ = [
    "advance",
    "cancel_task",
    "create_engine",
    "enqueue",
    "get_operation",
    "list_operations",
    "load_task",
    "wait_for",
]

P = ParamSpec("P")
R = TypeVar("R")
AsyncTarget = AsyncConnection | AsyncSession


def _awaited(
    fn: Callable[Concatenate[Connection | Session, P], R],
) -> Callable[Concatenate[AsyncTarget, P], Awaitable[R]]:
    """``fn`` run on the caller's async connection or session, in its transaction."""

    @functools.wraps(fn)
    async def run(conn: AsyncTarget, /, *args: P.args, **kwargs: P.kwargs) -> R:
        if isinstance(conn, AsyncSession):
            return await conn.run_sync(fn, *args, **kwargs)
        return await conn.run_sync(fn, *args, **kwargs)

    return run


create_engine = db.create_async_engine
enqueue = _awaited(api.enqueue)
advance = _awaited(api.advance)
cancel_task = _awaited(api.cancel_task)
load_task = _awaited(api.load_task)
list_operations = _awaited(api.list_operations)
get_operation = _awaited(api.get_operation)


async def wait_for(
    engine_or_connection: AsyncEngine | AsyncConnection,
    *,
    tenant_id: str,
    operation_id: str,
    timeout: float,
    unknown_patience: float | None = None,
) -> OperationRecord:
    """:func:`outbox.wait_for`, awaited: the same settled states, patience, timeout and
    refusals; the reads are short transactions of their own on the given engine or
    connection (not inside an open transaction), and on PostgreSQL the process's one
    LISTEN connection wakes the wait. The event loop is never blocked."""
    in_tx = isinstance(engine_or_connection, AsyncConnection) and (
        engine_or_connection.in_transaction())
    watch = Watch(tenant_id, operation_id, timeout, unknown_patience, in_transaction=in_tx)
    listener = listener_for(engine_or_connection.sync_engine)
    woken = _LoopEvent()
    if listener is not None:
        listener.register(watch.key, woken)
        if not listener.tried.is_set():  # only the first waiters wait at all
            await asyncio.to_thread(listener.tried.wait, LISTEN_READY_SECONDS)
    try:
        while True:
            woken.event.clear()  # before the read: a notification from here on wakes us
            op = await _read(engine_or_connection, tenant_id, operation_id)
            if watch.settled(op):
                return op
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(woken.event.wait(), watch.pause())
    finally:
        if listener is not None:
            listener.unregister(watch.key, woken)


class _LoopEvent:
    """An ``asyncio.Event`` the listener's thread may set (through the event loop)."""

    def __init__(self) -> None:
        self.event = asyncio.Event()
        self._loop = asyncio.get_running_loop()

    def set(self) -> None:
        self._loop.call_soon_threadsafe(self.event.set)


async def _read(
    target: AsyncEngine | AsyncConnection, tenant_id: str, operation_id: str
) -> OperationRecord:
    if isinstance(target, AsyncEngine):
        async with target.begin() as conn:
            found = await conn.run_sync(find, tenant_id, operation_id)
    else:
        async with target.begin():
            found = await target.run_sync(find, tenant_id, operation_id)
    if found is None:
        raise errors.OperationNotFound(tenant_id=tenant_id, operation_id=operation_id)
    return found
