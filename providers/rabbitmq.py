"""The ``rabbitmq`` provider: publish each operation as a persistent message, with
publisher confirms, to an exchange and routing key from the configuration.

Client: ``pika`` (the ``rabbitmq`` extra) — the maintained pure-Python AMQP 0-9-1 client;
its ``BlockingConnection`` fits the dispatcher's send threads directly (no event loop to
bridge, unlike an asyncio client). A pika connection is not thread-safe, so each send
thread keeps one connection and one confirm-mode channel of its own, reused across sends
and reopened after a failure.

The message: body = the payload as JSON, ``delivery_mode`` 2 (persistent), ``message_id``
= the idempotency key, ``content_type`` ``application/json``, headers
``outbox-operation-id``, ``outbox-fencing-token``, ``outbox-tenant`` and ``traceparent``
(when the row has one); published ``mandatory`` so an unroutable message comes back.

**What RabbitMQ promises, declared honestly.** RabbitMQ does not deduplicate: the same
message published twice is delivered twice. So by default ``dedup_retention_seconds`` is 0
and a publish whose outcome is unknown — the connection lost after the message was
written, before its confirm came — is ``AMBIGUOUS`` and the operation goes ``unknown``:
never re-published blindly. Only where the consumers deduplicate by ``message_id`` for a
stated window may the operator declare ``dedup_retention_seconds`` = that window; then
the dispatcher's window rules apply to re-sends. There is no look-up (a broker cannot be
asked whether a consumer processed a message): ``lookup_consistency`` is ``none``, and an
unknown operation is resolved by a person (``outboxd ops resolve``) or stays ``unknown``.

| what happened | outcome |
|---|---|
| the broker confirmed (basic.ack) | ``APPLIED`` (receipt: exchange, routing key, message id) |
| the broker refused it (basic.nack) | ``RETRYABLE`` — not stored |
| unroutable (returned: no queue bound) | ``RETRYABLE`` — not stored anywhere |
| connecting or opening the channel failed | ``RETRYABLE``, ``before_write`` |
| the connection broke after the publish, before its confirm | ``AMBIGUOUS``, ``after_write`` |
"""

from __future__ import annotations

import json
import logging
import threading
from typing import Any, Final
from urllib.parse import urlsplit

import pika
import pika.exceptions

from outbox.credential_refs import Secret, resolve_secret
from providers.base import (
    Capabilities,
    Dispatch,
    LookupKind,
    LookupResult,
    Outcome,
    OutcomeKind,
    TransportPhase,
)
from providers.options import SectionReader, read_capabilities

log = logging.getLogger("outboxd.providers.rabbitmq")
KIND: Final = "rabbitmq"


class _Link:
    """One send thread's connection and confirm-mode channel."""

    __slots__ = ("channel", "connection")

    def __init__(self, parameters: pika.ConnectionParameters) -> None:
        self.connection = pika.BlockingConnection(parameters)
        self.channel = self.connection.channel()
        self.channel.confirm_delivery()

    def close(self) -> None:
        try:
            if self.connection.is_open:
                self.connection.close()
        except Exception:  # closing a broken connection: nothing more to do
            log.debug("closing a broken connection")


class RabbitMqProvider:
    """Publishes one dispatch per call; safe to call from many threads at once."""

    def __init__(
        self,
        name: str,
        *,
        parameters: pika.ConnectionParameters,
        exchange: str,
        routing_key: str,
        capabilities: Capabilities,
    ) -> None:
        self.name = name
        self.capabilities = capabilities
        self.exchange = exchange
        self.routing_key = routing_key
        self._parameters = parameters
        self._local = threading.local()
        self._links: list[_Link] = []
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"RabbitMqProvider(name={self.name!r}, exchange={self.exchange!r})"

    def _link(self) -> _Link:
        link: _Link | None = getattr(self._local, "link", None)
        if link is not None and link.connection.is_open:
            # A blocking connection answers heartbeats only inside a call: one left idle
            # for two intervals has been closed by the broker, unseen. Reading what is
            # waiting finds that out before a publish is written into a dead socket
            # (which could only be reported ambiguous).
            try:
                link.connection.process_data_events(time_limit=0)
            except Exception:  # closed, or broken: a fresh connection, nothing written
                log.debug("renewing a connection the broker closed")
                self._drop(link)
                link = None
        if link is None or not link.connection.is_open or not link.channel.is_open:
            if link is not None:
                self._drop(link)
            link = _Link(self._parameters)
            self._local.link = link
            with self._lock:
                self._links.append(link)
        return link

    def _drop(self, link: _Link) -> None:
        link.close()
        with self._lock:
            if link in self._links:
                self._links.remove(link)
        self._local.link = None

    def routing_key_for(self, dispatch: Dispatch) -> str:
        return self.routing_key.format(tenant_id=dispatch.tenant_id,
                                       operation_id=dispatch.operation_id)

    def send(self, dispatch: Dispatch) -> Outcome:
        try:
            link = self._link()
        except Exception as exc:  # nothing was written
            return _outcome(OutcomeKind.RETRYABLE, TransportPhase.BEFORE_WRITE, exc,
                            "could not connect to the broker")
        headers: dict[str, Any] = {
            "outbox-operation-id": dispatch.operation_id,
            "outbox-fencing-token": dispatch.fencing_token,
            "outbox-tenant": dispatch.tenant_id,
        }
        if dispatch.traceparent:
            headers["traceparent"] = dispatch.traceparent
        properties = pika.BasicProperties(
            content_type="application/json", delivery_mode=pika.DeliveryMode.Persistent,
            message_id=dispatch.idempotency_key, headers=headers)
        body = json.dumps(dispatch.payload, separators=(",", ":"),
                          ensure_ascii=False).encode("utf-8")
        routing_key = self.routing_key_for(dispatch)
        try:
            link.channel.basic_publish(self.exchange, routing_key, body, properties,
                                       mandatory=True)
        except pika.exceptions.NackError as exc:
            return _outcome(OutcomeKind.RETRYABLE, TransportPhase.AFTER_WRITE, exc,
                            "the broker refused the message (nack)")
        except pika.exceptions.UnroutableError as exc:
            return _outcome(OutcomeKind.RETRYABLE, TransportPhase.AFTER_WRITE, exc,
                            "unroutable: no queue is bound for this routing key")
        except Exception as exc:  # the publish may have reached the broker
            self._drop(link)
            return _outcome(OutcomeKind.AMBIGUOUS, TransportPhase.AFTER_WRITE, exc,
                            "the connection broke before the broker confirmed")
        return Outcome(OutcomeKind.APPLIED, receipt={
            "exchange": self.exchange, "routing_key": routing_key,
            "message_id": dispatch.idempotency_key, "confirmed": True})

    def lookup(self, dispatch: Dispatch) -> LookupResult:
        return LookupResult(LookupKind.UNSUPPORTED)

    def close(self) -> None:
        with self._lock:
            links, self._links = self._links, []
        for link in links:
            link.close()


def _outcome(kind: OutcomeKind, phase: TransportPhase, exc: BaseException,
             reason: str) -> Outcome:
    return Outcome(kind, transport_phase=phase, error_class=type(exc).__name__, reason=reason)


def build_rabbitmq(name: str, reader: SectionReader) -> RabbitMqProvider:
    """Build from a ``[providers.NAME]`` table with ``kind = "rabbitmq"``."""
    url = reader.string("url", "amqp://127.0.0.1:5672/%2F")
    parts = urlsplit(url)
    if parts.scheme not in ("amqp", "amqps") or not parts.hostname:
        raise reader.error("url", "must be an amqp:// or amqps:// URL with a host")
    if parts.password:
        raise reader.error("url", "must not carry a password: set password = \"env:NAME\"")
    exchange = reader.string("exchange", "")
    routing_key = reader.string("routing_key", required=True)
    try:
        routing_key.format(tenant_id="t", operation_id="o")
    except (KeyError, IndexError, ValueError):
        raise reader.error("routing_key", "may only use {tenant_id} and {operation_id}") from None
    user = reader.optional_string("user")
    password: Secret | None = None
    if reader.has("password"):
        password = resolve_secret(reader.raw("password"), reader.key("password"))
    capabilities = read_capabilities(reader, lookup_available=False)
    heartbeat = reader.integer("heartbeat_seconds", 30, minimum=0)
    reader.finish()
    parameters = pika.URLParameters(url)
    if user is not None or password is not None:
        parameters.credentials = pika.PlainCredentials(
            user or "guest", password.reveal() if password is not None else "")
    parameters.socket_timeout = capabilities.timeout_seconds
    parameters.stack_timeout = capabilities.timeout_seconds
    parameters.blocked_connection_timeout = capabilities.timeout_seconds
    parameters.heartbeat = heartbeat
    parameters.connection_attempts = 1
    return RabbitMqProvider(name, parameters=parameters, exchange=exchange,
                            routing_key=routing_key, capabilities=capabilities)
