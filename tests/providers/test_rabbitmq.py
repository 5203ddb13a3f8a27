"""The RabbitMQ provider against the machine's RabbitMQ (127.0.0.1:5672, guest on
loopback): what a consumer receives, the confirms, and the honest declaration. A missing
broker skips with a loud reason, and fails under ``CI=true``."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from typing import Any

import pika
import pytest

from outbox.errors import ProviderConfigError
from providers.base import LookupConsistency, LookupKind, OutcomeKind, TransportPhase
from providers.rabbitmq import RabbitMqProvider
from providers.registry import build_providers
from tests.providers.scripted import make_dispatch
from tests.support.daemon import wait_until
from tests.support.rabbitmq import URL, declared_queue


@pytest.fixture
def queue() -> Iterator[str]:
    with declared_queue("outbox-test") as name:
        yield name


def received(queue: str) -> list[tuple[Any, Any]]:
    """Every message on ``queue`` (properties, decoded body), consumed."""
    conn = pika.BlockingConnection(pika.URLParameters(URL))
    channel = conn.channel()
    messages = []
    while True:
        method, properties, body = channel.basic_get(queue, auto_ack=True)
        if method is None:
            break
        messages.append((properties, json.loads(body)))
    conn.close()
    return messages


def build(**keys: object) -> RabbitMqProvider:
    provider = build_providers({"bus": {"kind": "rabbitmq", "url": URL, "timeout_seconds": 5,
                                        **keys}})["bus"]
    assert isinstance(provider, RabbitMqProvider)
    return provider


def test_a_confirmed_publish_is_applied_and_the_consumer_gets_the_message(queue: str) -> None:
    provider = build(routing_key=queue)
    try:
        dispatch = make_dispatch(payload={"refund": 1250, "note": "naïve ✓"},
                                 traceparent="00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
        outcome = provider.send(dispatch)
        assert outcome.kind is OutcomeKind.APPLIED
        assert outcome.receipt == {"exchange": "", "routing_key": queue,
                                   "message_id": dispatch.idempotency_key, "confirmed": True}
        again = provider.send(make_dispatch())  # the same thread's connection, reused
        assert again.kind is OutcomeKind.APPLIED
    finally:
        provider.close()
    (properties, body), _ = received(queue)
    assert body == dispatch.payload
    assert properties.message_id == dispatch.idempotency_key
    assert properties.delivery_mode == 2 and properties.content_type == "application/json"
    assert properties.headers["outbox-operation-id"] == dispatch.operation_id
    assert properties.headers["outbox-fencing-token"] == dispatch.fencing_token
    assert properties.headers["traceparent"] == dispatch.traceparent


def test_an_unroutable_message_is_a_clean_retry_not_an_effect(queue: str) -> None:
    provider = build(exchange="amq.direct", routing_key="nobody-bound-" + queue)
    try:
        outcome = provider.send(make_dispatch())
    finally:
        provider.close()
    assert outcome.kind is OutcomeKind.RETRYABLE and "unroutable" in (outcome.reason or "")


def test_the_declaration_is_no_deduplication_and_no_lookup_unless_stated(queue: str) -> None:
    provider = build(routing_key=queue)
    try:
        caps = provider.capabilities
        assert caps.dedup_retention_seconds == 0  # an ambiguous publish is never re-sent
        assert caps.lookup_consistency is LookupConsistency.NONE
        assert provider.lookup(make_dispatch()).kind is LookupKind.UNSUPPORTED
    finally:
        provider.close()
    stated = build(routing_key=queue, dedup_retention_seconds=600)  # consumers dedup by id
    try:
        assert stated.capabilities.dedup_retention_seconds == 600
    finally:
        stated.close()


def test_a_broker_that_cannot_be_reached_is_a_retry_before_the_write() -> None:
    provider = build_providers({"bus": {"kind": "rabbitmq", "url": "amqp://127.0.0.1:9/%2F",
                                        "routing_key": "q", "timeout_seconds": 2}})["bus"]
    try:
        outcome = provider.send(make_dispatch())
    finally:
        provider.close()
    assert outcome.kind is OutcomeKind.RETRYABLE
    assert outcome.transport_phase is TransportPhase.BEFORE_WRITE


@pytest.mark.parametrize(
    ("section", "problem"),
    [
        ({"url": "amqp://guest:guest@127.0.0.1/%2F", "routing_key": "q"},
         "url: must not carry a password"),
        ({"url": "http://127.0.0.1/", "routing_key": "q"}, "url: must be an amqp://"),
        ({}, "routing_key"),
        ({"routing_key": "{payload}"}, "routing_key: may only use"),
        ({"routing_key": "q", "password": "guest"}, "password: a literal credential"),
        ({"routing_key": "q", "lookup_consistency": "strong"}, "lookup_consistency"),
    ],
)
def test_configuration_errors_are_one_line_naming_the_key(
    section: dict[str, object], problem: str,
) -> None:
    with pytest.raises(ProviderConfigError, match=problem) as caught:
        build_providers({"bus": {"kind": "rabbitmq", **section}})
    assert "\n" not in str(caught.value) and "guest:guest" not in str(caught.value)


def _broker_connection_ports() -> set[int]:
    listed = subprocess.run(["rabbitmqctl", "-q", "list_connections", "peer_port"],
                            capture_output=True, text=True, timeout=60, check=True).stdout
    return {int(line) for line in listed.split() if line.isdigit()}


def test_a_connection_the_broker_closed_while_idle_is_renewed_before_the_publish(
    queue: str,
) -> None:
    """pika's blocking connection answers heartbeats only inside a call: a send thread idle
    for two heartbeat intervals finds its connection closed by the broker. That must cost a
    reconnect, never an ambiguous publish (which, undeclared, blocks the operation)."""
    provider = build(routing_key=queue, heartbeat_seconds=1)
    try:
        assert provider.send(make_dispatch()).kind is OutcomeKind.APPLIED
        link = provider._local.link
        port = link.connection._impl._transport._sock.getsockname()[1]
        wait_until(lambda: port not in _broker_connection_ports(), timeout=60,
                   message="the broker closed the idle connection")
        outcome = provider.send(make_dispatch())
        assert outcome.kind is OutcomeKind.APPLIED, outcome
    finally:
        provider.close()
    assert len(received(queue)) == 2
