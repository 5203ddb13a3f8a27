"""Standard Webhooks signatures on the ``http`` provider, verified by the specification's
published verifier (``standardwebhooks`` from PyPI), never by code of ours: what arrives at
a real loopback server — headers and the exact body bytes — is handed to it."""

from __future__ import annotations

import base64
import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from standardwebhooks.webhooks import Webhook, WebhookVerificationError

from outbox.errors import ProviderConfigError
from providers.base import OutcomeKind, Provider
from tests.providers.scripted import Reply, ScriptedServer, make_dispatch

MakeProvider = Callable[..., Provider]
NEW = "whsec_" + base64.b64encode(b"the-new-secret-32-bytes-long!!!!").decode()
OLD = "whsec_" + base64.b64encode(b"the-old-secret-32-bytes-long!!!!").decode()
OTHER = "whsec_" + base64.b64encode(b"somebody-elses-secret-32-bytes!!").decode()


@pytest.fixture
def secrets(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("WEBHOOK_SECRET_NEW", NEW)
    monkeypatch.setenv("WEBHOOK_SECRET_OLD", OLD)
    yield


def signed_provider(make_provider: MakeProvider, url: str, *refs: str) -> Provider:
    return make_provider(kind="http", url=url, dedup_retention_seconds=3600,
                         signing="standard-webhooks", signing_secrets=list(refs))


def test_the_published_verifier_accepts_what_we_send(
    secrets: None, scripted: ScriptedServer, make_provider: MakeProvider
) -> None:
    scripted.always(Reply(201))
    provider = signed_provider(make_provider, scripted.url, "env:WEBHOOK_SECRET_NEW")
    dispatch = make_dispatch(payload={"title": "Printer on fire", "note": "naïve ✓"})
    assert provider.send(dispatch).kind is OutcomeKind.APPLIED
    (request,) = scripted.requests
    assert request.headers["webhook-id"] == dispatch.idempotency_key
    assert Webhook(NEW).verify(request.body, request.headers) == dict(dispatch.payload)
    with pytest.raises(WebhookVerificationError):
        Webhook(OTHER).verify(request.body, request.headers)
    with pytest.raises(WebhookVerificationError):  # the exact bytes are signed
        Webhook(NEW).verify(request.body + b" ", request.headers)


def test_rotation_signs_with_every_secret_and_either_verifies(
    secrets: None, scripted: ScriptedServer, make_provider: MakeProvider
) -> None:
    scripted.always(Reply(201))
    provider = signed_provider(make_provider, scripted.url,
                               "env:WEBHOOK_SECRET_NEW", "env:WEBHOOK_SECRET_OLD")
    provider.send(make_dispatch())
    (request,) = scripted.requests
    assert len(request.headers["webhook-signature"].split(" ")) == 2
    for secret in (NEW, OLD):  # receivers on either side of the rotation
        Webhook(secret).verify(request.body, request.headers)


def test_a_resend_of_the_same_operation_carries_the_same_webhook_id(
    secrets: None, scripted: ScriptedServer, make_provider: MakeProvider
) -> None:
    scripted.replies = lambda r: Reply(503) if len(scripted.requests) == 1 else Reply(201)
    provider = signed_provider(make_provider, scripted.url, "env:WEBHOOK_SECRET_NEW")
    dispatch = make_dispatch()
    assert provider.send(dispatch).kind is OutcomeKind.RETRYABLE
    assert provider.send(dispatch).kind is OutcomeKind.APPLIED
    first, second = scripted.requests
    assert first.headers["webhook-id"] == second.headers["webhook-id"] == dispatch.idempotency_key
    for request in (first, second):
        Webhook(NEW).verify(request.body, request.headers)


def test_a_secret_from_a_file_and_a_bare_base64_secret(
    tmp_path: Path, scripted: ScriptedServer, make_provider: MakeProvider
) -> None:
    path = tmp_path / "webhook-secret"
    path.write_text(NEW.removeprefix("whsec_") + "\n")  # as a mounted secret: a newline
    scripted.always(Reply(201))
    provider = signed_provider(make_provider, scripted.url, f"file:{path}")
    provider.send(make_dispatch())
    Webhook(NEW).verify(scripted.requests[0].body, scripted.requests[0].headers)


@pytest.mark.parametrize(
    ("section", "problem"),
    [
        ({"signing": "standard-webhooks"}, "signing_secrets: needs at least one secret"),
        ({"signing": "standard-webhooks", "signing_secrets": [NEW]},
         "signing_secrets[0]: a literal credential is not allowed"),
        ({"signing": "standard-webhooks", "signing_secrets": ["env:WEBHOOK_BAD"]},
         "signing_secrets[0]: env:WEBHOOK_BAD is not base64"),
        ({"signing": "standard-webhooks", "signing_secrets": ["env:WEBHOOK_SHORT"]},
         "signing_secrets[0]: env:WEBHOOK_SHORT is shorter than 16 bytes"),
        ({"signing_secrets": ["env:WEBHOOK_SECRET_NEW"]}, "signing_secrets: is set but signing"),
        ({"signing": "hmac"}, "providers.p.signing"),
    ],
)
def test_signing_configuration_errors_are_one_line_naming_the_key(
    secrets: None, monkeypatch: pytest.MonkeyPatch, make_provider: MakeProvider,
    section: dict[str, object], problem: str,
) -> None:
    monkeypatch.setenv("WEBHOOK_BAD", "not base64 at all!")
    monkeypatch.setenv("WEBHOOK_SHORT", base64.b64encode(b"short").decode())
    with pytest.raises(ProviderConfigError) as caught:
        make_provider(kind="http", url="http://127.0.0.1:9/x", **section)
    message = str(caught.value)
    assert problem in message and "\n" not in message
    for value in (NEW, os.environ["WEBHOOK_BAD"]):
        assert value not in message  # never the secret
