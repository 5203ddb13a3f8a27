"""The machine's RabbitMQ (127.0.0.1:5672, guest on loopback) for tests: a uniquely named
durable queue for one test, and a loud skip (a failure under ``CI=true``) without a broker.

The broker is shared by every test process (xdist workers, and any other test run on the
machine), and the chaos tests restart it. So each test holds a lock on the broker while it
uses it: shared by ordinary tests, exclusive by a test that stops the broker. (pytest-xdist's
``xdist_group`` cannot be relied on for this: under pytest 9 its grouping is silently a
no-op, and a restart once landed in another worker's test.)"""

from __future__ import annotations

import fcntl
import os
import tempfile
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pika
import pytest

URL = "amqp://127.0.0.1:5672/%2F"
LOCK = Path(tempfile.gettempdir()) / "outboxd-tests-rabbitmq.lock"


def unavailable(why: str) -> None:
    message = f"RabbitMQ is not reachable on 127.0.0.1:5672 ({why})"
    if os.environ.get("CI") == "true":
        pytest.fail(message + " (CI=true: a skipped RabbitMQ test is a failure)")
    pytest.skip(message)


@contextmanager
def holding_the_broker(*, exclusive: bool) -> Iterator[None]:
    """Hold the machine's broker: shared with other tests, or alone (to restart it)."""
    with LOCK.open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


@contextmanager
def declared_queue(prefix: str, *, exclusive: bool = False) -> Iterator[str]:
    """A durable queue named ``<prefix>-<random>`` on the default exchange, deleted after;
    the broker is held (``holding_the_broker``) for as long."""
    with holding_the_broker(exclusive=exclusive):
        yield from _queue(prefix)


def _queue(prefix: str) -> Iterator[str]:
    name = f"{prefix}-{uuid.uuid4().hex[:10]}"
    try:
        conn = pika.BlockingConnection(pika.URLParameters(URL))
    except pika.exceptions.AMQPError as exc:
        unavailable(type(exc).__name__)
    conn.channel().queue_declare(name, durable=True)
    conn.close()
    yield name
    conn = pika.BlockingConnection(pika.URLParameters(URL))
    conn.channel().queue_delete(name)
    conn.close()
