"""The HTTP provider's lookup: GET on the template; 200 found, 404 not found."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from providers.base import LookupConsistency, LookupKind, Provider
from tests.providers.scripted import Reply, ScriptedServer, make_dispatch

MakeProvider = Callable[..., Provider]


def with_lookup(make_provider: MakeProvider, scripted: ScriptedServer) -> Provider:
    return make_provider(
        kind="http", url=f"{scripted.url}/effects", timeout_seconds=0.5,
        lookup_url=f"{scripted.url}/effects/by-key/{{idempotency_key}}?op={{operation_id}}",
    )


def test_found_carries_the_receipt_and_quotes_the_key(
    make_provider: MakeProvider, scripted: ScriptedServer
) -> None:
    scripted.always(Reply(200, {"Content-Type": "application/json"}, b'{"effect_id": "e1"}'))
    provider = with_lookup(make_provider, scripted)
    assert provider.capabilities.lookup_consistency is LookupConsistency.STRONG
    result = provider.lookup(make_dispatch(idempotency_key="k/1 ?&", operation_id="op#1"))
    assert result.kind is LookupKind.FOUND
    assert result.receipt is not None and result.receipt["body"] == {"effect_id": "e1"}
    assert result.observed_at is not None
    [request] = scripted.requests
    assert request.method == "GET"
    assert request.path == "/effects/by-key/k%2F1%20%3F%26?op=op%231"
    assert "idempotency-key" not in request.headers


def test_not_found(make_provider: MakeProvider, scripted: ScriptedServer) -> None:
    scripted.always(Reply(404))
    result = with_lookup(make_provider, scripted).lookup(make_dispatch())
    assert result.kind is LookupKind.NOT_FOUND and result.receipt is None
    assert result.evidence["status_code"] == 404


@pytest.mark.parametrize("reply", [Reply(500), Reply(503), Reply(302), Reply(401),
                                   Reply(action="hang"), Reply(action="close")])
def test_anything_else_is_indeterminate(
    make_provider: MakeProvider, scripted: ScriptedServer, reply: Reply
) -> None:
    scripted.always(reply)
    result = with_lookup(make_provider, scripted).lookup(make_dispatch())
    assert result.kind is LookupKind.INDETERMINATE


def test_no_lookup_url_is_unsupported_and_declared_none(
    make_provider: MakeProvider, scripted: ScriptedServer
) -> None:
    provider = make_provider(kind="http", url=f"{scripted.url}/effects")
    assert provider.capabilities.lookup_consistency is LookupConsistency.NONE
    assert provider.lookup(make_dispatch()).kind is LookupKind.UNSUPPORTED
    assert scripted.requests == []
