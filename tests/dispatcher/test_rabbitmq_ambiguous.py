"""One ambiguous publish, made on purpose, against the machine's real broker.

The daemon reaches RabbitMQ through a loopback proxy (tests/support/cutting_proxy.py) that
relays one chosen message to the broker, waits for the broker's confirm, swallows it and
drops the connection: the message is in the queue, the dispatcher saw its connection break
before any confirm. What happens next is the declaration's to decide:

- declared honestly (RabbitMQ does not deduplicate): the operation goes ``unknown`` with the
  attempt's evidence and, with no look-up to ask, ``blocked`` for a person; it is never
  published again — the queue holds its one message;
- declared ``dedup_retention_seconds`` (the consumers deduplicate by ``message_id``): the
  attempt is inside that window, so the same message is published again with the same
  ``message_id``; the queue holds two copies and the consumers keep one.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa

from tests.dispatcher import both, engine_at, key_of, rows, stage, url_for
from tests.dispatcher.test_rabbitmq_chaos import messages_per_key
from tests.support.cutting_proxy import CuttingProxy
from tests.support.daemon import DaemonProcess, status_counts, wait_until, write_config
from tests.support.rabbitmq import declared_queue

pytestmark = pytest.mark.slow
N = 20
CUT = "cut-00000"


@pytest.fixture
def queue() -> Iterator[str]:
    with declared_queue("outbox-ambiguous") as name:
        yield name


def drain_through_a_cut(request: pytest.FixtureRequest, tmp_path: Path, dialect: str,
                        queue: str, cut_ends: str, **declaration: float
                        ) -> tuple[dict[str, str], Counter[str], list[dict[str, object]]]:
    """Drain N operations and the one whose confirm is lost until the N are applied and
    the cut one is ``cut_ends``; the status by operation id, the messages per message id,
    the cut operation's attempts."""
    db_url = url_for(request, dialect)
    with CuttingProxy(5672) as proxy, engine_at(db_url) as engine:
        proxy.arm(f'"op":"{CUT}"'.encode())
        cfg = write_config(tmp_path, db_url, {"bus": {
            "kind": "rabbitmq", "url": f"amqp://127.0.0.1:{proxy.port}/%2F",
            "routing_key": queue, "timeout_seconds": 5, "in_flight_seconds": 5,
            "retry_max_delay_seconds": 0.2, **declaration}},
            dispatcher={"batch_size": 10, "concurrency": 4})
        stage(engine, 1, prefix="cut", provider="bus")
        stage(engine, N, provider="bus")
        with DaemonProcess(cfg):
            wait_until(proxy.cut.is_set, timeout=60, message="the confirm cut")
            wait_until(lambda: status_counts(engine).get("applied", 0) >= N, timeout=60,
                       message="the others applied")
            wait_until(lambda: rows(engine, "SELECT status FROM outbox_operations "
                                            "WHERE operation_id = :op", op=CUT)[0]["status"]
                       == cut_ends, timeout=60, message=f"the cut operation {cut_ends}")
        with engine.connect() as conn:
            status = {str(r.operation_id): str(r.status) for r in conn.execute(sa.text(
                "SELECT operation_id, status FROM outbox_operations"))}
        attempts = rows(engine, "SELECT result_class, transport_phase FROM outbox_attempts "
                                "WHERE operation_id = :op ORDER BY attempt", op=CUT)
    return status, messages_per_key(queue), attempts


@pytest.mark.parametrize("dialect", both())
def test_declared_honestly_a_lost_confirm_is_left_to_a_person_and_not_published_again(
    request: pytest.FixtureRequest, tmp_path: Path, dialect: str, queue: str
) -> None:
    status, seen, attempts = drain_through_a_cut(request, tmp_path, dialect, queue,
                                                 cut_ends="blocked")  # no look-up: a person
    assert status.pop(CUT) == "blocked"
    assert [a["result_class"] for a in attempts] == ["ambiguous"]
    assert attempts[0]["transport_phase"] == "after_write"
    assert seen[key_of(CUT)] == 1  # the broker took it; it was not published again
    assert set(status.values()) == {"applied"}
    assert all(seen[key_of(op)] == 1 for op in status)


@pytest.mark.parametrize("dialect", both())
def test_with_consumers_that_deduplicate_a_lost_confirm_is_published_again_in_the_window(
    request: pytest.FixtureRequest, tmp_path: Path, dialect: str, queue: str
) -> None:
    status, seen, attempts = drain_through_a_cut(request, tmp_path, dialect, queue,
                                                 cut_ends="applied",
                                                 dedup_retention_seconds=600)
    assert status.pop(CUT) == "applied"
    assert [a["result_class"] for a in attempts] == ["ambiguous", "applied"]
    assert seen[key_of(CUT)] == 2  # one same-id copy, for the consumers to drop
    assert set(status.values()) == {"applied"}
    assert all(seen[key_of(op)] == 1 for op in status)
