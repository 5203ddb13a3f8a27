"""CloudEvents envelopes on the ``http`` provider, parsed by the CloudEvents SDK
(``cloudevents`` from PyPI), never by code of ours: what arrives at a real loopback server
— headers and body bytes — is handed to its HTTP binding, in binary and structured mode."""

from __future__ import annotations

import base64
import json
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import pytest
from cloudevents.core.bindings.http import HTTPMessage, from_http_event
from standardwebhooks.webhooks import Webhook

from outbox.errors import ProviderConfigError
from providers.base import OutcomeKind, Provider
from tests.providers.scripted import Recorded, Reply, ScriptedServer, make_dispatch

MakeProvider = Callable[..., Provider]
STAGED = datetime(2026, 12, 6, 6, 32, 33, 665000, tzinfo=UTC)
SECRET = "whsec_" + base64.b64encode(b"a-webhook-secret-of-32-bytes!!!!").decode()


def parsed(request: Recorded) -> Any:
    return from_http_event(HTTPMessage(headers=request.headers, body=request.body))


@pytest.mark.parametrize("mode", ["cloudevents-binary", "cloudevents-structured"])
def test_the_sdk_reads_the_event_we_send(
    mode: str, scripted: ScriptedServer, make_provider: MakeProvider
) -> None:
    scripted.always(Reply(201))
    provider = make_provider(name="tickets", kind="http", url=scripted.url,
                             dedup_retention_seconds=3600, envelope=mode)
    dispatch = make_dispatch(operation_id="ticket:create:case-1", created_at=STAGED,
                             payload={"title": "Printer on fire", "note": "naïve ✓ 100%"})
    assert provider.send(dispatch).kind is OutcomeKind.APPLIED
    (request,) = scripted.requests
    event = parsed(request)
    assert event.get_specversion() == "1.0"
    assert event.get_id() == dispatch.idempotency_key
    assert event.get_source() == "/outboxd/providers/tickets"
    assert event.get_type() == "dev.outboxd.tickets"
    assert event.get_subject() == "ticket:create:case-1"
    assert event.get_time() == STAGED
    assert event.get_data() == dispatch.payload
    if mode == "cloudevents-binary":
        assert request.headers["content-type"] == "application/json"
        assert json.loads(request.body) == dispatch.payload
    else:
        assert request.headers["content-type"] == "application/cloudevents+json"


def test_a_resend_is_the_same_event_and_the_signature_covers_the_envelope(
    monkeypatch: pytest.MonkeyPatch, scripted: ScriptedServer, make_provider: MakeProvider
) -> None:
    monkeypatch.setenv("WEBHOOK_SECRET", SECRET)
    scripted.replies = lambda r: Reply(503) if len(scripted.requests) == 1 else Reply(201)
    provider = make_provider(kind="http", url=scripted.url, dedup_retention_seconds=3600,
                             envelope="cloudevents-structured", event_source="urn:acme:agents",
                             event_type="com.acme.ticket.create",
                             signing="standard-webhooks", signing_secrets=["env:WEBHOOK_SECRET"])
    dispatch = make_dispatch(created_at=STAGED)
    provider.send(dispatch)
    provider.send(dispatch)
    first, second = scripted.requests
    assert first.body == second.body  # the same event, byte for byte
    for request in (first, second):
        event = parsed(request)
        assert (event.get_source(), event.get_type()) == (
            "urn:acme:agents", "com.acme.ticket.create")
        Webhook(SECRET).verify(request.body, request.headers, json_parse=False)


@pytest.mark.parametrize(
    ("section", "problem"),
    [
        ({"envelope": "cloudevents"}, "providers.p.envelope"),
        ({"event_source": "urn:x"}, "event_source: is set but envelope is not"),
        ({"envelope": "cloudevents-binary", "headers": {"ce-id": "env:X"}},
         "headers: ce- headers are the CloudEvents envelope's"),
    ],
)
def test_envelope_configuration_errors_name_the_key(
    monkeypatch: pytest.MonkeyPatch, make_provider: MakeProvider,
    section: dict[str, object], problem: str,
) -> None:
    monkeypatch.setenv("X", "x")
    with pytest.raises(ProviderConfigError, match=problem):
        make_provider(kind="http", url="http://127.0.0.1:9/x", **section)
