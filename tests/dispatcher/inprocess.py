"""An in-process worker for tests that drive its steps one at a time: a receiver that
applies every request and counts them per key, waits on the worker's finished sends, the
operations' statuses. The worker, the statements and the database are real."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from dispatcher.engine.settings import WorkerSettings
from dispatcher.engine.worker import Worker
from outbox import db
from providers.base import (
    Capabilities,
    Dispatch,
    LookupKind,
    LookupResult,
    Outcome,
    OutcomeKind,
)


class Counting:
    """A receiver that applies every request and counts them per key."""

    name = "sim"
    capabilities = Capabilities(dedup_retention_seconds=3600.0)

    def __init__(self) -> None:
        self.sent: Counter[str] = Counter()
        self._lock = threading.Lock()

    def send(self, d: Dispatch) -> Outcome:
        with self._lock:
            self.sent[d.idempotency_key] += 1
        return Outcome(OutcomeKind.APPLIED, status_code=201, receipt={"id": d.operation_id})

    def lookup(self, d: Dispatch) -> LookupResult:
        return LookupResult(LookupKind.FOUND if self.sent[d.idempotency_key] else
                            LookupKind.NOT_FOUND)

    def close(self) -> None:
        pass


def statuses(engine: Engine) -> Counter[str]:
    with engine.connect() as conn:
        return Counter(s for (s,) in conn.execute(sa.text("SELECT status FROM outbox_operations")))


def sends_finished(worker: Worker, n: int) -> None:
    deadline = threading.Event()
    for _ in range(500):  # the in-process sends return at once; waits on their queue
        if worker._done.qsize() >= n:
            return
        deadline.wait(0.01)
    raise AssertionError(f"{n} sends did not finish")


@contextmanager
def worker_at(url: str, **engine_args: Any) -> Iterator[tuple[Engine, Worker, Counting]]:
    """A worker (batch 5, concurrency 10) on a new engine, with its receiver; closed after."""
    engine = db.create_engine(url, **engine_args)
    receiver = Counting()
    worker = Worker(engine, {"sim": receiver},
                    WorkerSettings(worker_id="w1", batch_size=5, concurrency=10))
    try:
        yield engine, worker, receiver
    finally:
        worker.close()
        engine.dispose()
