"""The HTTP provider's status mapping (DESIGN.md contract), against a real server."""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime

import pytest

from providers.base import OutcomeKind, Provider, TransportPhase
from providers.http_response import parse_retry_after
from tests.providers.scripted import Reply, ScriptedServer, make_dispatch

MakeProvider = Callable[..., Provider]


def http(make_provider: MakeProvider, scripted: ScriptedServer, **keys: object) -> Provider:
    return make_provider(kind="http", url=f"{scripted.url}/effects", timeout_seconds=2, **keys)


def test_request_carries_protocol_headers_and_json_payload(
    make_provider: MakeProvider, scripted: ScriptedServer
) -> None:
    provider = http(make_provider, scripted)
    dispatch = make_dispatch(fencing_token=42, traceparent="00-" + "a" * 32 + "-" + "b" * 16
                             + "-01")
    outcome = provider.send(dispatch)
    assert outcome.kind is OutcomeKind.APPLIED
    [request] = scripted.requests
    assert request.method == "POST" and request.path == "/effects"
    assert request.headers["idempotency-key"] == dispatch.idempotency_key
    assert request.headers["outbox-operation-id"] == dispatch.operation_id
    assert request.headers["outbox-fencing-token"] == "42"
    assert request.headers["outbox-tenant"] == "tenant-a"
    assert request.headers["traceparent"] == dispatch.traceparent
    assert request.headers["content-type"] == "application/json"
    assert json.loads(request.body) == dispatch.payload


def test_no_traceparent_header_when_the_row_has_none(
    make_provider: MakeProvider, scripted: ScriptedServer
) -> None:
    http(make_provider, scripted).send(make_dispatch())
    assert "traceparent" not in scripted.requests[0].headers


@pytest.mark.parametrize("status", [200, 201, 204])
def test_2xx_is_applied_with_receipt(
    make_provider: MakeProvider, scripted: ScriptedServer, status: int
) -> None:
    body = b"" if status == 204 else b'{"id": "t_1"}'
    scripted.always(Reply(status, {"Content-Type": "application/json", "X-Request-Id": "r1",
                                   "Set-Cookie": "s=1"}, body))
    outcome = http(make_provider, scripted).send(make_dispatch())
    assert outcome.kind is OutcomeKind.APPLIED
    assert outcome.status_code == status
    assert outcome.transport_phase is TransportPhase.RESPONSE
    assert outcome.replayed is False
    receipt = outcome.receipt
    assert receipt is not None
    assert receipt["status"] == status
    assert receipt["headers"]["x-request-id"] == "r1"
    assert "set-cookie" not in receipt["headers"]
    assert receipt["body"] == ({"id": "t_1"} if body else "")
    assert len(receipt["body_sha256"]) == 64


def test_idempotent_replayed_header_sets_replayed(
    make_provider: MakeProvider, scripted: ScriptedServer
) -> None:
    scripted.always(Reply(200, {"Idempotent-Replayed": "true"}))
    outcome = http(make_provider, scripted).send(make_dispatch())
    assert outcome.kind is OutcomeKind.APPLIED and outcome.replayed is True


@pytest.mark.parametrize(
    ("status", "kind"),
    [
        (202, OutcomeKind.ACCEPTED),
        (409, OutcomeKind.IN_FLIGHT),
        (422, OutcomeKind.KEY_MISMATCH),
        (400, OutcomeKind.REJECTED),
        (401, OutcomeKind.REJECTED),
        (404, OutcomeKind.REJECTED),
        (410, OutcomeKind.REJECTED),
        (500, OutcomeKind.AMBIGUOUS),
        (502, OutcomeKind.AMBIGUOUS),
        (504, OutcomeKind.AMBIGUOUS),
        (303, OutcomeKind.AMBIGUOUS),
    ],
)
def test_status_mapping(
    make_provider: MakeProvider, scripted: ScriptedServer, status: int, kind: OutcomeKind
) -> None:
    scripted.always(Reply(status, {"Location": "http://127.0.0.1:1/elsewhere"},
                          b'{"error": "x"}'))
    outcome = http(make_provider, scripted).send(make_dispatch())
    assert outcome.kind is kind
    assert outcome.status_code == status
    assert outcome.transport_phase is TransportPhase.RESPONSE
    assert outcome.receipt is not None and outcome.receipt["status"] == status
    if kind is not OutcomeKind.ACCEPTED:
        assert outcome.reason is not None and str(status) in outcome.reason
    assert len(scripted.requests) == 1  # a redirect is never followed


@pytest.mark.parametrize("status", [408, 425, 429, 503])
def test_retryable_statuses_honour_retry_after_seconds(
    make_provider: MakeProvider, scripted: ScriptedServer, status: int
) -> None:
    scripted.always(Reply(status, {"Retry-After": "7"}))
    outcome = http(make_provider, scripted).send(make_dispatch())
    assert outcome.kind is OutcomeKind.RETRYABLE
    assert outcome.status_code == status
    assert outcome.retry_after_seconds == 7.0


def test_retry_after_http_date(make_provider: MakeProvider, scripted: ScriptedServer) -> None:
    when = datetime.now(UTC) + timedelta(seconds=120)
    scripted.always(Reply(429, {"Retry-After": format_datetime(when, usegmt=True)}))
    outcome = http(make_provider, scripted).send(make_dispatch())
    assert outcome.kind is OutcomeKind.RETRYABLE
    assert outcome.retry_after_seconds is not None
    assert 110 <= outcome.retry_after_seconds <= 121


def test_retryable_without_retry_after(
    make_provider: MakeProvider, scripted: ScriptedServer
) -> None:
    scripted.always(Reply(503))
    outcome = http(make_provider, scripted).send(make_dispatch())
    assert outcome.kind is OutcomeKind.RETRYABLE and outcome.retry_after_seconds is None


def test_parse_retry_after_edge_cases() -> None:
    now = datetime(2024, 1, 1, tzinfo=UTC)
    assert parse_retry_after("0") == 0.0
    assert parse_retry_after("-5") == 0.0
    assert parse_retry_after("1e12") == 86_400.0
    assert parse_retry_after("nan") is None
    assert parse_retry_after("soon") is None
    assert parse_retry_after("") is None
    assert parse_retry_after(None) is None
    assert parse_retry_after("Mon, 01 Jan 2024 00:00:30 GMT", now) == 30.0
    assert parse_retry_after("Sun, 31 Dec 2023 00:00:00 GMT", now) == 0.0


def test_stripe_400_idempotency_error_is_key_mismatch_only_when_configured(
    make_provider: MakeProvider, scripted: ScriptedServer
) -> None:
    body = b'{"error": {"type": "idempotency_error", "message": "Keys for idempotent..."}}'
    scripted.always(Reply(400, {"Content-Type": "application/json"}, body))
    stripe = http(make_provider, scripted, mismatch_status=400)
    assert stripe.send(make_dispatch()).kind is OutcomeKind.KEY_MISMATCH
    plain = http(make_provider, scripted)
    assert plain.send(make_dispatch()).kind is OutcomeKind.REJECTED
    scripted.always(Reply(400, {}, b'{"error": {"type": "invalid_request_error"}}'))
    assert stripe.send(make_dispatch()).kind is OutcomeKind.REJECTED


def test_large_body_is_bounded_and_hashed_as_read(
    make_provider: MakeProvider, scripted: ScriptedServer
) -> None:
    scripted.always(Reply(200, {"Content-Type": "application/json"}, b"x" * 500_000))
    outcome = http(make_provider, scripted, max_response_bytes=4096).send(make_dispatch())
    assert outcome.kind is OutcomeKind.APPLIED
    receipt = outcome.receipt
    assert receipt is not None
    assert receipt["body_truncated"] is True
    assert isinstance(receipt["body"], str) and len(receipt["body"]) <= 4096


def test_non_object_json_body_is_kept_as_text(
    make_provider: MakeProvider, scripted: ScriptedServer
) -> None:
    scripted.always(Reply(200, {}, b'["not", "an", "object"]'))
    outcome = http(make_provider, scripted).send(make_dispatch())
    assert outcome.receipt is not None
    assert outcome.receipt["body"] == '["not", "an", "object"]'
    assert outcome.receipt["body_truncated"] is False


def test_unserialisable_payload_is_rejected_before_write(
    make_provider: MakeProvider, scripted: ScriptedServer
) -> None:
    outcome = http(make_provider, scripted).send(make_dispatch(payload={"x": object()}))
    assert outcome.kind is OutcomeKind.REJECTED
    assert outcome.transport_phase is TransportPhase.BEFORE_WRITE
    assert scripted.requests == []


def test_header_injection_in_ids_is_refused_before_write(
    make_provider: MakeProvider, scripted: ScriptedServer
) -> None:
    outcome = http(make_provider, scripted).send(make_dispatch(tenant_id="a\r\nX-Evil: 1"))
    assert outcome.kind is OutcomeKind.REJECTED
    assert outcome.transport_phase is TransportPhase.BEFORE_WRITE
    assert scripted.requests == []
