"""The record step on a thread of its own (PostgreSQL): while one batch's outcomes are
recorded, the next batch is claimed. A record that fails there loses nothing: its outcomes
stay in hand, the failure surfaces in the dispatch loop, and the next record writes them —
without sending anything again.

The failure is the database's own: a trigger on ``outbox_attempts`` refuses the record
statement's insert, then is dropped. The worker, the statements and the database are real;
the receiver is an in-process object implementing the provider protocol."""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from tests.dispatcher import stage
from tests.dispatcher.inprocess import sends_finished, statuses, worker_at

pytestmark = pytest.mark.postgres

REFUSE = """
CREATE FUNCTION refuse_attempts() RETURNS trigger LANGUAGE plpgsql AS
$$ BEGIN RAISE EXCEPTION 'refused by the test'; END $$;
CREATE TRIGGER refuse_attempts BEFORE INSERT ON outbox_attempts
FOR EACH ROW EXECUTE FUNCTION refuse_attempts();
"""


def test_a_failed_record_keeps_its_outcomes_and_the_next_one_writes_them(pg_url: str) -> None:
    with worker_at(pg_url) as (engine, worker, receiver):
        stage(engine, 5)
        assert worker.claim_and_dispatch() == 5
        sends_finished(worker, 5)
        with engine.begin() as conn:
            conn.exec_driver_sql(REFUSE)

        assert worker.record_done() == 5  # handed to the recording thread
        with pytest.raises(sa.exc.DBAPIError, match="refused by the test"):
            worker.record_done(force=True)  # waits for it: the failure surfaces here
        assert statuses(engine) == {"dispatching": 5}
        assert worker.in_flight() == 5 and worker.has_done()

        with engine.begin() as conn:
            conn.exec_driver_sql("DROP TRIGGER refuse_attempts ON outbox_attempts")
        assert worker.record_done() == 5
        worker.record_done(force=True)
        assert statuses(engine) == {"applied": 5}
        assert worker.in_flight() == 0 and not worker.has_done()
        assert set(receiver.sent.values()) == {1} and len(receiver.sent) == 5


def test_the_next_batch_is_claimed_while_one_is_recorded(pg_url: str) -> None:
    """The record runs beside the next claim: with the record of batch one held up (its
    statement waits for a lock the test holds), batch two is claimed and sent."""
    with worker_at(pg_url) as (engine, worker, receiver):
        stage(engine, 10)
        assert worker.claim_and_dispatch() == 5
        sends_finished(worker, 5)
        with engine.connect() as blocker:
            blocker.exec_driver_sql("BEGIN")
            blocker.exec_driver_sql("LOCK TABLE outbox_attempts IN EXCLUSIVE MODE")
            assert worker.record_done() == 5  # its statement now waits for the lock
            assert worker.claim_and_dispatch() == 5
            sends_finished(worker, 5)
            assert statuses(engine) == {"dispatching": 10}
            blocker.exec_driver_sql("ROLLBACK")
        worker.record_done(force=True)
        worker.record_done(force=True)
        assert statuses(engine) == {"applied": 10}
        assert len(receiver.sent) == 10 and set(receiver.sent.values()) == {1}
