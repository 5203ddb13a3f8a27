"""The machine's RabbitMQ (127.0.0.1:5672, guest on loopback) for tests: a uniquely named
durable queue for one test, and a loud skip (a failure under ``CI=true``) without a broker."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import pika
import pytest

URL = "amqp://127.0.0.1:5672/%2F"


def unavailable(why: str) -> None:
    message = f"RabbitMQ is not reachable on 127.0.0.1:5672 ({why})"
    if os.environ.get("CI") == "true":
        pytest.fail(message + " (CI=true: a skipped RabbitMQ test is a failure)")
    pytest.skip(message)


@contextmanager
def declared_queue(prefix: str) -> Iterator[str]:
    """A durable queue named ``<prefix>-<random>`` on the default exchange; deleted after."""
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
