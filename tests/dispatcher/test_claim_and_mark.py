"""PostgreSQL claims and marks a batch in one statement, and falls back to two steps
(claim, checks, mark and refusals) when a row is refused — by the statement (its deadline
passed) or by the checks (a row that would not be sent). The fallback leaves no trace of
the rolled-back statement: a refused row's trail is ``pending -> claimed -> <refusal>``,
never ``dispatching``; every other row of the batch is sent once. The worker, the
statements and the database are real; the receiver is an in-process object."""

from __future__ import annotations

from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Engine

from dispatcher.engine.worker import Worker
from outbox import schema
from tests.dispatcher import operation, stage, transitions
from tests.dispatcher.inprocess import Counting, sends_finished, statuses, worker_at

pytestmark = pytest.mark.postgres
ops = schema.operations


@pytest.fixture(params=["unprepared", "prepared"])
def engine_args(request: pytest.FixtureRequest) -> dict[str, Any]:
    """The daemon's two kinds of connection: statements prepared server-side (PostgreSQL
    reached directly: the claim's ``BEGIN`` goes in its round trip), or not (a pooler)."""
    return {"options": {"prepare_threshold": "5"}} if request.param == "prepared" else {}


def two_step_claims(worker: Worker, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts the worker's two-step claims (the store's own method runs)."""
    calls: list[int] = []
    claim = worker.store.claim

    def counted(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        return claim(*args, **kwargs)

    monkeypatch.setattr(worker.store, "claim", counted)
    return calls


def assert_refused_and_the_rest_applied(
    engine: Engine, receiver: Counting, refused: str, reason: str, others: list[str]
) -> None:
    """``refused`` was parked ``blocked`` for ``reason`` without a ``dispatching`` step or
    an attempt; every one of ``others`` was sent once and applied."""
    row = operation(engine, refused)
    assert (row["status"], row["status_reason"], row["attempts"]) == ("blocked", reason, 0)
    assert transitions(engine, refused) == [("pending", "claimed"), ("claimed", "blocked")]
    assert statuses(engine) == {"applied": len(others), "blocked": 1}
    assert set(receiver.sent.values()) == {1} and len(receiver.sent) == len(others)
    for i in others:
        assert operation(engine, i)["attempts"] == 1
        assert transitions(engine, i) == [
            ("pending", "claimed"), ("claimed", "dispatching"), ("dispatching", "applied")]


def test_a_batch_that_passes_is_marked_by_the_claim_statement(
    pg_url: str, monkeypatch: pytest.MonkeyPatch, engine_args: dict[str, Any]
) -> None:
    with worker_at(pg_url, **engine_args) as (engine, worker, receiver):
        ids = stage(engine, 5)
        two_steps = two_step_claims(worker, monkeypatch)
        assert worker.claim_and_dispatch() == 5
        assert two_steps == []
        sends_finished(worker, 5)
        worker.record_done(force=True)
        assert statuses(engine) == {"applied": 5}
        assert set(receiver.sent.values()) == {1} and len(receiver.sent) == 5
        for i in ids:
            assert transitions(engine, i) == [
                ("pending", "claimed"), ("claimed", "dispatching"), ("dispatching", "applied")]


def test_a_row_past_its_deadline_sends_the_batch_to_two_steps(
    pg_url: str, monkeypatch: pytest.MonkeyPatch, engine_args: dict[str, Any]
) -> None:
    with worker_at(pg_url, **engine_args) as (engine, worker, receiver):
        two_steps = two_step_claims(worker, monkeypatch)
        ids = stage(engine, 5)
        with engine.begin() as conn:
            conn.execute(sa.update(ops).where(ops.c.operation_id == ids[2])
                         .values(deadline_at=sa.func.now() - sa.text("interval '1 second'")))
        assert worker.claim_and_dispatch() == 5
        assert two_steps == [1]
        sends_finished(worker, 4)
        worker.record_done(force=True)
        assert_refused_and_the_rest_applied(
            engine, receiver, ids[2], "deadline_passed", ids[:2] + ids[3:])


def test_a_row_the_checks_refuse_sends_the_batch_to_two_steps(
    pg_url: str, monkeypatch: pytest.MonkeyPatch, engine_args: dict[str, Any]
) -> None:
    with worker_at(pg_url, **engine_args) as (engine, worker, receiver):
        two_steps = two_step_claims(worker, monkeypatch)
        # first in line: a row for a provider this worker does not have
        ids = stage(engine, 1, prefix="bad", provider="nope") + stage(engine, 4, start=1)
        assert worker.claim_and_dispatch() == 5
        assert two_steps == [1]
        sends_finished(worker, 4)
        worker.record_done(force=True)
        assert_refused_and_the_rest_applied(engine, receiver, ids[0], "unknown_provider", ids[1:])
        # the connection the rolled-back statement ran on is kept, and serves the next batch
        ids2 = stage(engine, 5, start=5)
        assert worker.claim_and_dispatch() == 5
        assert two_steps == [1]  # this batch passed: one statement
        sends_finished(worker, 5)
        worker.record_done(force=True)
        assert all(operation(engine, i)["status"] == "applied" for i in ids2)
