"""The claiming and recording threads keep their connections between batches
(PostgreSQL). A kept connection the server has dropped fails one cycle as an outage —
nothing claimed, sent or lost — and the next cycle takes a fresh one. Real PostgreSQL; the
receiver is an in-process object implementing the provider protocol."""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from outbox import db
from tests.dispatcher import stage
from tests.dispatcher.inprocess import sends_finished, statuses, worker_at

pytestmark = pytest.mark.postgres

TERMINATE_OTHERS = (
    "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
    " WHERE datname = current_database() AND pid <> pg_backend_pid()"
)


def test_a_dropped_kept_connection_costs_one_cycle_and_nothing_else(pg_url: str) -> None:
    with worker_at(pg_url) as (engine, worker, receiver):
        stage(engine, 10)
        assert worker.claim_and_dispatch() == 5
        sends_finished(worker, 5)
        assert worker.record_done() == 5  # on the recording thread, on its connection
        worker.record_done(force=True)  # collected
        assert statuses(engine) == {"applied": 5, "pending": 5}

        admin = db.create_engine(pg_url)
        try:
            with admin.connect() as conn:
                assert conn.exec_driver_sql(TERMINATE_OTHERS).scalar_one() >= 1
        finally:
            admin.dispose()

        with pytest.raises(sa.exc.DBAPIError) as lost:
            worker.claim_and_dispatch()
        assert db.is_outage(lost.value)
        assert statuses(engine) == {"applied": 5, "pending": 5}  # nothing claimed

        assert worker.claim_and_dispatch() == 5  # a fresh connection
        sends_finished(worker, 5)
        assert worker.record_done() == 5  # the recording thread's connection was dropped too
        with pytest.raises(sa.exc.DBAPIError) as lost:
            worker.record_done(force=True)  # its failure surfaces here; outcomes kept
        assert db.is_outage(lost.value)
        assert statuses(engine) == {"applied": 5, "dispatching": 5}
        assert worker.record_done() == 5  # the recording thread takes a fresh connection
        worker.record_done(force=True)
        assert statuses(engine) == {"applied": 10}
        assert len(receiver.sent) == 10 and set(receiver.sent.values()) == {1}


def test_a_pool_of_one_keeps_no_connection(pg_url: str) -> None:
    """``pool_size = 1`` allows two connections: kept by the two threads, they would leave
    none for anything else (lease extension, maintenance, the gauges). Then every
    statement takes one from the pool and returns it."""
    with worker_at(pg_url, pool_size=1, pool_timeout=2) as (engine, worker, _receiver):
        stage(engine, 10)
        for _ in range(2):
            assert worker.claim_and_dispatch() == 5
            sends_finished(worker, 5)
            assert worker.record_done() == 5  # on the recording thread
            worker.record_done(force=True)
            with engine.connect() as conn, engine.connect() as other:  # both free again
                assert conn.exec_driver_sql("SELECT 1").scalar_one() == 1
                assert other.exec_driver_sql("SELECT 1").scalar_one() == 1
        assert statuses(engine) == {"applied": 10}
