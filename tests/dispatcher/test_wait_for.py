"""``outbox.wait_for`` and ``outbox.aio.wait_for``: the agent's way back to its receipt, on
both dialects, each test run with the sync and the async API (the ``agent`` fixture). The
waiter is this test process; the dispatcher is an ``outboxd run`` process of its own."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import sqlalchemy as sa

import outbox
from outbox import errors
from outbox.ddl import SETTLED_CHANNEL
from outbox.waiting import keys_of
from tests.dispatcher import TENANT, config, drain_once, engine_at, stage
from tests.support.agents import Agent
from tests.support.daemon import DaemonProcess
from tests.support.sim import SimProcess


@pytest.mark.slow
def test_a_waiter_in_another_process_gets_the_receipt_or_the_reason(
    db_url: str, agent: Agent, tmp_path: Path
) -> None:
    (sent,) = stage(agent.engine, 1, prefix="sent")
    (held,) = stage(agent.engine, 1, prefix="held", requires_approval=True)
    with SimProcess(tmp_path) as sim, DaemonProcess(config(tmp_path, db_url, sim)):
        applied = agent.wait_for(tenant_id=TENANT, operation_id=sent, timeout=60)
        blocked = agent.wait_for(tenant_id=TENANT, operation_id=held, timeout=60)
    assert applied.status is outbox.OperationStatus.APPLIED
    assert applied.receipt  # what the receiver answered
    assert (blocked.status, blocked.status_reason) == (outbox.OperationStatus.BLOCKED,
                                                       "approval_missing")


def test_a_wait_that_times_out_names_the_operation_and_its_state(agent: Agent) -> None:
    (op,) = stage(agent.engine, 1)
    with pytest.raises(errors.WaitTimeout) as caught:
        agent.wait_for(tenant_id=TENANT, operation_id=op, timeout=0.2)
    assert (caught.value.operation_id, caught.value.status) == (op, "pending")
    assert "pending" in str(caught.value) and op in str(caught.value)


def test_waiting_for_nothing_or_inside_a_transaction_is_refused_at_once(agent: Agent) -> None:
    with pytest.raises(errors.OperationNotFound):
        agent.wait_for(tenant_id=TENANT, operation_id="no-such-op", timeout=30)
    (op,) = stage(agent.engine, 1)
    with agent.begin() as conn, pytest.raises(errors.OutboxError, match="commit first"):
        agent.wait_for(conn, tenant_id=TENANT, operation_id=op, timeout=30)
    with agent.connect() as conn, pytest.raises(errors.WaitTimeout):
        agent.wait_for(conn, tenant_id=TENANT, operation_id=op, timeout=0.1)
    with pytest.raises(errors.InvalidPayload):
        agent.wait_for(tenant_id=TENANT, operation_id=op, timeout=-1)


def test_unknown_is_settled_only_after_the_callers_patience(agent: Agent) -> None:
    """The dispatcher reconciles ``unknown`` on its own: without a patience the wait goes
    on (and times out naming ``unknown``); with one, the record comes back once the
    operation has been unknown that long in this wait."""
    (op,) = stage(agent.engine, 1)
    with agent.engine.begin() as conn:
        conn.execute(sa.text("UPDATE outbox_operations SET status = 'unknown', "
                             "status_reason = 'ambiguous_response'"))
    with pytest.raises(errors.WaitTimeout) as caught:
        agent.wait_for(tenant_id=TENANT, operation_id=op, timeout=0.3)
    assert caught.value.status == "unknown"
    start = time.monotonic()
    found = agent.wait_for(tenant_id=TENANT, operation_id=op, timeout=30, unknown_patience=0.2)
    assert (found.status, found.status_reason) == (outbox.OperationStatus.UNKNOWN,
                                                   "ambiguous_response")
    assert time.monotonic() - start >= 0.2  # not before the patience


@pytest.mark.slow
@pytest.mark.postgres
def test_the_record_step_notifies_each_operation_it_settles(pg_url: str, tmp_path: Path) -> None:
    """The notification ``wait_for`` wakes on: sent by the record statement itself, a JSON
    array of the settled operations' ``[tenant_id, operation_id]`` pairs, each payload
    under PostgreSQL's 8,000 bytes (ids of 500 characters here: a batch's pairs take several
    notifications), delivered when it commits; every settled operation named once."""
    import psycopg

    with engine_at(pg_url) as engine, psycopg.connect(
            pg_url.replace("+psycopg", ""), autocommit=True) as listening:
        listening.execute(f"LISTEN {SETTLED_CHANNEL}")
        ids = stage(engine, 40, prefix="p" * 500)
        with SimProcess(tmp_path) as sim:
            drain_once(config(tmp_path, pg_url, sim))
        heard: list[tuple[str, str]] = []
        sizes: list[int] = []
        for note in listening.notifies(timeout=5):
            sizes.append(len(note.payload.encode()))
            keys = keys_of(note.payload)
            assert keys is not None, note.payload[:200]
            heard += keys
            if len(heard) >= len(ids):
                break
        assert sorted(heard) == [(TENANT, i) for i in ids]
        assert len(sizes) > 1 and max(sizes) < 8000
        assert outbox.wait_for(engine, tenant_id=TENANT, operation_id=ids[0],
                               timeout=5).receipt


@pytest.mark.slow
@pytest.mark.postgres
def test_an_operation_too_long_to_notify_is_recorded_and_found_by_reading(
    pg_url: str, tmp_path: Path
) -> None:
    """PostgreSQL refuses a notification of 8,000 bytes or more, and the statement that
    sends it; an operation whose ids alone take half that is named in none (its waiters
    read it), and the rest of its batch is recorded and notified — one such row does not
    halt the record of every other."""
    import psycopg

    with engine_at(pg_url) as engine, psycopg.connect(
            pg_url.replace("+psycopg", ""), autocommit=True) as listening:
        listening.execute(f"LISTEN {SETTLED_CHANNEL}")
        (long_id,) = stage(engine, 1, prefix="x" * 9000)
        ids = stage(engine, 2, prefix="short")
        with SimProcess(tmp_path) as sim:
            drain_once(config(tmp_path, pg_url, sim))
        heard = [k for n in listening.notifies(timeout=10, stop_after=1)
                 for k in keys_of(n.payload) or []]
        assert sorted(heard) == [(TENANT, i) for i in ids]
        found = outbox.wait_for(engine, tenant_id=TENANT, operation_id=long_id, timeout=5)
        assert found.status is outbox.OperationStatus.APPLIED
