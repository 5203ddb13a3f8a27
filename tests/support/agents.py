"""The agent-side API as a contract test calls it, in either flavour: ``outbox.api`` on a
synchronous engine, or ``outbox.aio`` on an asyncio engine of the same database, each
call awaited to completion on one event loop. A test written against :class:`Agent` runs
on both — one contract suite, not a second copy of the tests.

Connections and sessions handed to a test are the flavour's own (``Connection`` /
``AsyncConnection``, ``Session`` / ``AsyncSession``); a test passes them back to the
agent's methods and never calls them directly (``sql`` runs a statement on one).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from contextlib import AbstractAsyncContextManager, contextmanager
from typing import Any

from sqlalchemy.engine import Engine
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import Session

from outbox import aio, api, db, waiting
from outbox.records import OperationRecord, TaskRecord

FLAVOURS = ("sync", "async")


class Agent:
    """The calls of the agent API, run in one flavour."""

    flavour = "sync"

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    # -- connections -------------------------------------------------------------------
    @contextmanager
    def begin(self) -> Iterator[Any]:
        """A connection in a transaction, committed at the end (rolled back on an error)."""
        with self.engine.begin() as conn:
            yield conn

    @contextmanager
    def connect(self) -> Iterator[Any]:
        """A connection with no transaction begun."""
        with self.engine.connect() as conn:
            yield conn

    @contextmanager
    def session(self) -> Iterator[Any]:
        """An ORM session in a transaction, committed at the end."""
        with Session(self.engine) as session, session.begin():
            yield session

    def sql(self, conn: Any, statement: str) -> None:
        conn.exec_driver_sql(statement)

    # -- the API -------------------------------------------------------------------------
    def _call(self, name: str, conn: Any, *args: Any, **kwargs: Any) -> Any:
        return getattr(api, name)(conn, *args, **kwargs)

    def advance(self, conn: Any, task_id: str, **kwargs: Any) -> TaskRecord:
        result: TaskRecord = self._call("advance", conn, task_id, **kwargs)
        return result

    def enqueue(self, conn: Any, **kwargs: Any) -> OperationRecord:
        result: OperationRecord = self._call("enqueue", conn, **kwargs)
        return result

    def cancel_task(self, conn: Any, **kwargs: Any) -> api.CancelResult:
        result: api.CancelResult = self._call("cancel_task", conn, **kwargs)
        return result

    def load_task(self, conn: Any, **kwargs: Any) -> TaskRecord:
        result: TaskRecord = self._call("load_task", conn, **kwargs)
        return result

    def list_operations(self, conn: Any, **kwargs: Any) -> list[OperationRecord]:
        result: list[OperationRecord] = self._call("list_operations", conn, **kwargs)
        return result

    def get_operation(self, conn: Any, **kwargs: Any) -> OperationRecord:
        result: OperationRecord = self._call("get_operation", conn, **kwargs)
        return result

    def wait_for(self, conn: Any = None, **kwargs: Any) -> OperationRecord:
        """Wait on ``conn``, or on the engine when None."""
        return waiting.wait_for(self.engine if conn is None else conn, **kwargs)

    def close(self) -> None:
        pass


class AsyncAgent(Agent):
    """The same calls through ``outbox.aio`` on an asyncio engine of the same database."""

    flavour = "async"

    def __init__(self, engine: Engine) -> None:
        super().__init__(engine)
        self._runner = asyncio.Runner()
        self.aengine = db.create_async_engine(engine.url.render_as_string(hide_password=False))

    def run(self, awaitable: Any) -> Any:
        return self._runner.run(_awaiting(awaitable))

    @contextmanager
    def _entered(self, manager: AbstractAsyncContextManager[Any]) -> Iterator[Any]:
        value = self.run(manager.__aenter__())
        try:
            yield value
        except BaseException as exc:
            if not self.run(manager.__aexit__(type(exc), exc, exc.__traceback__)):
                raise
        else:
            self.run(manager.__aexit__(None, None, None))

    @contextmanager
    def begin(self) -> Iterator[Any]:
        with self._entered(self.aengine.begin()) as conn:
            yield conn

    @contextmanager
    def connect(self) -> Iterator[Any]:
        with self._entered(self.aengine.connect()) as conn:
            yield conn

    @contextmanager
    def session(self) -> Iterator[Any]:
        with self._entered(AsyncSession(self.aengine)) as session, self._entered(
            session.begin()
        ):
            yield session

    def sql(self, conn: Any, statement: str) -> None:
        self.run(conn.exec_driver_sql(statement))

    def _call(self, name: str, conn: Any, *args: Any, **kwargs: Any) -> Any:
        return self.run(getattr(aio, name)(conn, *args, **kwargs))

    def wait_for(self, conn: Any = None, **kwargs: Any) -> OperationRecord:
        result: OperationRecord = self.run(
            aio.wait_for(self.aengine if conn is None else conn, **kwargs))
        return result

    def close(self) -> None:
        self.run(self.aengine.dispose())
        self._runner.close()


async def _awaiting(awaitable: Any) -> Any:
    return await awaitable


def agent_for(flavour: str, engine: Engine) -> Agent:
    made: Callable[[Engine], Agent] = AsyncAgent if flavour == "async" else Agent
    return made(engine)
