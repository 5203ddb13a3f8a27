"""The RabbitMQ provider under faults, against the machine's real broker: the dispatcher is
SIGKILLed and RabbitMQ's application is stopped and started (``rabbitmqctl stop_app`` /
``start_app``) in the middle of a drain; a consumer counts what arrived.

With the honest declaration (no deduplication, no look-up), nothing is lost and nothing is
published twice: every operation ends ``applied`` with exactly one message, or — where an
attempt's outcome could not be known (killed after the publish, the broker gone before the
confirm) — ``unknown`` or ``blocked`` with its evidence, with at most the one message that
attempt may have left. None is re-sent blindly. The test restarts the broker the other
RabbitMQ tests share, so it holds the broker alone while it runs (``declared_queue``)."""

from __future__ import annotations

import json
import signal
import subprocess
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pika
import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Engine

from tests.dispatcher import both, engine_at, stage, url_for
from tests.support.daemon import DaemonProcess, status_counts, wait_until, write_config
from tests.support.rabbitmq import URL, declared_queue

N = 300
pytestmark = pytest.mark.slow


@pytest.fixture
def queue() -> Iterator[str]:
    with declared_queue("outbox-chaos", exclusive=True) as name:  # it restarts the broker
        yield name


def messages_per_key(queue: str) -> Counter[str]:
    conn = pika.BlockingConnection(pika.URLParameters(URL))
    channel = conn.channel()
    seen: Counter[str] = Counter()
    while True:
        method, properties, body = channel.basic_get(queue, auto_ack=True)
        if method is None:
            break
        json.loads(body)
        seen[properties.message_id] += 1
    conn.close()
    return seen


def broker(action: str) -> None:
    subprocess.run(["rabbitmqctl", action], check=True, capture_output=True, timeout=120)


def settled(engine: Engine, final: tuple[str, ...]) -> bool:
    counts = status_counts(engine)
    return sum(counts.get(s, 0) for s in final) == N


def run_with_faults(request: pytest.FixtureRequest, tmp_path: Path, dialect: str, queue: str,
                    final: tuple[str, ...] = ("applied", "unknown", "blocked"),
                    **declaration: float) -> tuple[dict[str, Any], Counter[str], int, int]:
    """Drain N operations through one SIGKILL and one broker restart until every one is
    in a ``final`` state; the rows by operation id, the messages per message id, and the
    kills and restarts made."""
    db_url = url_for(request, dialect)
    cfg = write_config(tmp_path, db_url, {"bus": {
        "kind": "rabbitmq", "url": URL, "routing_key": queue, "timeout_seconds": 2,
        "in_flight_seconds": 2, "max_attempts": 20, "max_elapsed_seconds": 600,
        "retry_max_delay_seconds": 0.5, **declaration}},
        dispatcher={"lease_seconds": 2, "batch_size": 10, "concurrency": 4})
    with engine_at(db_url) as engine:
        ids = stage(engine, N, provider="bus")
        kills = restarts = 0
        with DaemonProcess(cfg) as first:
            wait_until(lambda: status_counts(engine).get("applied", 0) >= N // 5, timeout=60,
                       message="a fifth applied")
            first.signal(signal.SIGKILL)
            first.wait()
            kills += 1
        with DaemonProcess(cfg):
            wait_until(lambda: status_counts(engine).get("applied", 0) >= N // 2, timeout=60,
                       message="half applied")
            broker("stop_app")
            restarts += 1
            broker("start_app")
            broker("await_startup")
            wait_until(lambda: settled(engine, final), timeout=120, interval=0.2,
                       message=f"every operation {' or '.join(final)}")
        seen = messages_per_key(queue)
        with engine.connect() as conn:
            rows = {r.operation_id: r for r in conn.execute(sa.text(
                "SELECT operation_id, idempotency_key, status, last_outcome "
                "FROM outbox_operations"))}
    assert set(rows) == set(ids)
    return rows, seen, kills, restarts


@pytest.mark.parametrize("dialect", both())
def test_kills_and_a_broker_restart_lose_nothing_and_publish_nothing_twice(
    request: pytest.FixtureRequest, tmp_path: Path, dialect: str, queue: str
) -> None:
    rows, seen, kills, restarts = run_with_faults(request, tmp_path, dialect, queue)
    assert max(seen.values()) == 1, "a message was published twice"
    applied = [r for r in rows.values() if r.status == "applied"]
    uncertain = [r for r in rows.values() if r.status in ("unknown", "blocked")]
    assert all(seen[r.idempotency_key] == 1 for r in applied)  # nothing lost
    assert all(r.last_outcome for r in uncertain)  # with the evidence of the attempt
    assert len(applied) + len(uncertain) == N
    print(f"rabbitmq chaos [{dialect}]: {N} operations, {kills} kill(s), {restarts} broker "
          f"restart(s): {len(applied)} applied, {len(uncertain)} unknown/blocked "
          f"({sum(seen[r.idempotency_key] for r in uncertain)} of them left a message), "
          f"{sum(seen.values())} messages, 0 duplicates")


@pytest.mark.parametrize("dialect", both())
def test_with_consumers_that_deduplicate_ambiguous_publishes_are_retried_in_the_window(
    request: pytest.FixtureRequest, tmp_path: Path, dialect: str, queue: str
) -> None:
    """Declared: the consumers deduplicate by message_id for ten minutes. An ambiguous
    publish inside that window is published again with the same message_id (the broker may
    then hold two copies; the consumers keep one). An attempt lost with its dispatcher
    (killed mid-send) is still settled by a person: there is no look-up to ask, and
    recovery does not guess. Nothing lost, nothing foreign, one effect per operation after
    the consumers' deduplication."""
    rows, seen, kills, restarts = run_with_faults(request, tmp_path, dialect, queue,
                                                  dedup_retention_seconds=600)
    applied = [r for r in rows.values() if r.status == "applied"]
    held = [r for r in rows.values() if r.status != "applied"]
    assert all(seen[r.idempotency_key] >= 1 for r in applied)  # nothing lost
    assert set(seen) <= {r.idempotency_key for r in rows.values()}  # nothing foreign
    assert all(r.status in ("unknown", "blocked") and r.last_outcome for r in held)
    copies = sum(seen.values()) - len(seen)
    print(f"rabbitmq chaos, consumers deduplicate [{dialect}]: {N} operations, {kills} "
          f"kill(s), {restarts} broker restart(s): {len(applied)} applied, {len(held)} "
          f"unknown/blocked, {sum(seen.values())} messages, {copies} same-id copies for the "
          "consumers to drop")
