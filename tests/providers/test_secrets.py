"""Credentials: references only, resolved at build, never in logs, errors or reprs."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

import pytest

from outbox.credential_refs import Secret, resolve_secret
from outbox.errors import ProviderConfigError
from providers.base import OutcomeKind, Provider
from providers.registry import build_providers
from tests.providers.scripted import Reply, ScriptedServer, make_dispatch

CANARY = "sk_live_CANARY_7f3a9c1e5b"
MakeProvider = Callable[..., Provider]


def test_env_and_file_references(tmp_path: Path) -> None:
    secret_file = tmp_path / "token"
    secret_file.write_text(f"{CANARY}\n")
    from_env = resolve_secret("env:TOKEN", "k", {"TOKEN": CANARY})
    from_file = resolve_secret(f"file:{secret_file}", "k")
    assert from_env.reveal() == CANARY == from_file.reveal()
    for secret in (from_env, from_file):
        assert CANARY not in repr(secret) and CANARY not in str(secret)
        assert CANARY not in f"{secret}" and CANARY not in f"{secret} {secret!r}"


@pytest.mark.parametrize(
    ("reference", "problem"),
    [
        (CANARY, "literal"),
        (f"Bearer {CANARY}", "literal"),
        (f"vault:{CANARY}", "literal"),
        ("env:", "literal"),
        ("env:MISSING_VAR_FOR_TEST", "not set"),
        ("file:/nonexistent/secret", "cannot read"),
        (123, "string reference"),
    ],
)
def test_bad_references_name_the_key_not_the_value(reference: object, problem: str) -> None:
    with pytest.raises(ProviderConfigError) as caught:
        resolve_secret(reference, "providers.x.headers.Authorization", {})
    message = str(caught.value)
    assert message.startswith("providers.x.headers.Authorization")
    assert problem in message
    assert CANARY not in message and CANARY not in repr(caught.value)


def test_literal_header_value_in_config_is_an_error() -> None:
    section = {"kind": "http", "url": "http://127.0.0.1:9/x",
               "headers": {"Authorization": f"Bearer {CANARY}"}}
    with pytest.raises(ProviderConfigError) as caught:
        build_providers({"tickets": section})
    assert "providers.tickets.headers.Authorization" in str(caught.value)
    assert CANARY not in str(caught.value)


def test_secret_cannot_be_pickled() -> None:
    import pickle

    with pytest.raises(TypeError):
        pickle.dumps(Secret(CANARY, "env:X"))


def test_canary_goes_on_the_wire_but_nowhere_else(
    make_provider: MakeProvider, scripted: ScriptedServer, monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    monkeypatch.setenv("OUTBOXD_TEST_CANARY", CANARY)
    caplog.set_level(logging.DEBUG)
    provider = make_provider(
        "tickets", kind="http", url=f"{scripted.url}/effects", timeout_seconds=0.5,
        lookup_url=f"{scripted.url}/by-key/{{idempotency_key}}",
        headers={"Authorization": "env:OUTBOXD_TEST_CANARY"},
    )
    seen: list[object] = [repr(provider), str(provider), provider.capabilities]
    for reply in (Reply(201), Reply(500), Reply(429, {"Retry-After": "1"}), Reply(400),
                  Reply(action="close"), Reply(action="hang")):
        scripted.always(reply)
        outcome = provider.send(make_dispatch())
        lookup = provider.lookup(make_dispatch())
        seen.extend([outcome, lookup, repr(outcome), repr(lookup)])
    assert scripted.requests[0].headers["authorization"] == CANARY  # it was sent
    assert any(r.kind is OutcomeKind.AMBIGUOUS for r in seen if hasattr(r, "kind"))
    assert caplog.records, "the provider logs its sends at debug level"
    text = caplog.text + " ".join(repr(item) for item in seen)
    text += " ".join(str(r.args) for r in caplog.records)
    assert CANARY not in text
