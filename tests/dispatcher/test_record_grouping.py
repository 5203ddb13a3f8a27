"""One record for the sends of several claimed batches. While the dispatch loop works
through a backlog with room for another full batch, finished sends wait (holding their
slots) until the slots run short, and are then recorded together — on PostgreSQL in one
statement, each row fenced on its own batch's token. At low load (a claim that came back
short) a finished send is recorded at once, as before. A real worker against a real
database of each dialect; the provider applies every send at once."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from dispatcher.config import load_config
from dispatcher.daemon import Daemon
from dispatcher.engine import worker as worker_module
from dispatcher.engine.worker import Worker
from outbox import db
from providers.base import Capabilities, Dispatch, LookupKind, LookupResult, Outcome, OutcomeKind
from tests.dispatcher import PROVIDER, stage
from tests.support.daemon import status_counts, wait_until, write_config

BATCH = 10


class Instant:
    """A receiver that applies every send at once."""

    name = PROVIDER
    capabilities = Capabilities(dedup_retention_seconds=3600.0)

    def send(self, d: Dispatch) -> Outcome:
        return Outcome(OutcomeKind.APPLIED, status_code=201, receipt={"id": d.operation_id})

    def lookup(self, d: Dispatch) -> LookupResult:
        return LookupResult(LookupKind.NOT_FOUND)

    def close(self) -> None:
        pass


@pytest.fixture
def daemon(db_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Daemon]:
    # no record is made for having waited: each test says when it is due by the slots
    monkeypatch.setattr(worker_module, "RECORD_LINGER_SECONDS", 3600.0)
    cfg = write_config(tmp_path, db_url, {PROVIDER: {"kind": "null"}},
                       dispatcher={"batch_size": BATCH, "concurrency": 4 * BATCH})
    d = Daemon(load_config(cfg, env={}), providers={PROVIDER: Instant()})
    try:
        yield d
    finally:
        d.worker.wait_in_flight(10)
        d.worker.close()
        d.engine.dispose()


def finished(worker: Worker) -> int:
    return worker._done.qsize()


def sent(worker: Worker, count: int) -> Callable[[], bool]:
    return lambda: finished(worker) == count


def counted_records(worker: Worker) -> list[int]:
    """The items of each ``record_many`` call the worker makes, in order."""
    calls: list[int] = []
    record_many = worker.store.record_many

    def counted(conn: Any, *, items: Any, actor: str) -> set[int]:
        calls.append(len(items))
        return record_many(conn, items=items, actor=actor)

    worker.store.record_many = counted  # type: ignore[method-assign]
    return calls


def test_a_backlog_records_the_sends_of_several_batches_together(
    daemon: Daemon, db_url: str
) -> None:
    engine = db.create_engine(db_url)
    try:
        stage(engine, 6 * BATCH)
        worker = daemon.worker
        records = counted_records(worker)
        for n in range(1, 5):
            assert worker.claim_and_dispatch() == BATCH
            wait_until(sent(worker, n * BATCH), timeout=30, message=f"{n} batches sent")
            # room for another full batch: the record waits for more
            assert worker.record_due() is (n == 4), n
            assert worker.record_done() == (4 * BATCH if n == 4 else 0)
        # the slots ran short: one record took the four batches' sends
        wait_until(lambda: status_counts(engine).get("applied") == 4 * BATCH, timeout=30,
                   message="the four batches recorded")
        worker.record_done(force=True)
        assert records == [4 * BATCH]
        with engine.connect() as conn:
            tokens = conn.execute(sa.text(
                "SELECT count(DISTINCT fencing_token), count(*) FROM outbox_attempts")).one()
        assert tuple(tokens) == (4, 4 * BATCH)
    finally:
        engine.dispose()


def test_at_low_load_a_finished_send_is_recorded_at_once(daemon: Daemon, db_url: str) -> None:
    engine = db.create_engine(db_url)
    try:
        stage(engine, 3)
        worker = daemon.worker
        assert worker.claim_and_dispatch() == 3  # short: everything eligible was found
        wait_until(lambda: finished(worker) == 3, timeout=30, message="three sent")
        assert worker.record_due()
        assert worker.record_done() == 3
        wait_until(lambda: status_counts(engine) == {"applied": 3}, timeout=30,
                   message="the three recorded")
    finally:
        engine.dispose()
