"""Building providers from ``[providers.NAME]`` tables; errors name the key."""

from __future__ import annotations

from typing import Any

import pytest

from outbox.errors import ProviderConfigError
from providers.base import Capabilities, LookupConsistency, Provider
from providers.http import HttpProvider
from providers.registry import KNOWN_KINDS, build_providers

URL = "http://127.0.0.1:9/effects"


def build(section: dict[str, Any], name: str = "tickets") -> Provider:
    return build_providers({name: section})[name]


def error_for(section: dict[str, Any], name: str = "tickets") -> str:
    with pytest.raises(ProviderConfigError) as caught:
        build(section, name)
    return str(caught.value)


def test_known_kinds() -> None:
    assert {"http", "null", "nats"} <= KNOWN_KINDS


def test_http_defaults() -> None:
    provider = build({"kind": "http", "url": URL})
    try:
        assert isinstance(provider, HttpProvider)
        assert isinstance(provider, Provider)
        assert provider.name == "tickets"
        assert provider.capabilities == Capabilities(
            dedup_retention_seconds=0.0, lookup_consistency=LookupConsistency.NONE,
            in_flight_seconds=20.0, timeout_seconds=10.0,
        )
    finally:
        provider.close()


def test_http_full_declaration() -> None:
    provider = build({
        "kind": "http", "url": URL, "lookup_url": URL + "/by-key/{idempotency_key}",
        "lookup_consistency": "eventual", "lookup_settle_seconds": 5,
        "dedup_retention_seconds": 86400, "in_flight_seconds": 30, "fencing": True,
        "payload_schemas": [1, 2], "max_attempts": 3, "max_elapsed_seconds": 60,
        "timeout_seconds": 4, "retry_max_delay_seconds": 2.5,
    })
    try:
        caps = provider.capabilities
        assert caps.lookup_consistency is LookupConsistency.EVENTUAL
        assert caps.lookup_settle_seconds == 5.0
        assert caps.dedup_retention_seconds == 86400.0
        assert caps.in_flight_seconds == 30.0 and caps.fencing is True
        assert caps.payload_schemas == frozenset({1, 2})
        assert (caps.max_attempts, caps.max_elapsed_seconds, caps.timeout_seconds) == (3, 60, 4)
        assert caps.retry_max_delay_seconds == 2.5
    finally:
        provider.close()


def test_in_flight_defaults_to_twice_the_timeout_and_lookup_to_strong() -> None:
    provider = build({"kind": "http", "url": URL, "timeout_seconds": 3,
                      "lookup_url": URL + "/{operation_id}"})
    try:
        assert provider.capabilities.in_flight_seconds == 6.0
        assert provider.capabilities.lookup_consistency is LookupConsistency.STRONG
    finally:
        provider.close()


@pytest.mark.parametrize(
    ("section", "key"),
    [
        ({"kind": "smtp"}, "providers.tickets.kind"),
        ({"kind": 3}, "providers.tickets.kind"),
        ({}, "providers.tickets.kind"),
        ({"kind": "http"}, "providers.tickets.url"),
        ({"kind": "http", "url": "ftp://x/y"}, "providers.tickets.url"),
        ({"kind": "http", "url": URL, "colour": "red"}, "providers.tickets.colour"),
        ({"kind": "http", "url": URL, "timeout_seconds": 0}, "providers.tickets.timeout_seconds"),
        ({"kind": "http", "url": URL, "timeout_seconds": "10"},
         "providers.tickets.timeout_seconds"),
        ({"kind": "http", "url": URL, "max_attempts": 0}, "providers.tickets.max_attempts"),
        ({"kind": "http", "url": URL, "retry_max_delay_seconds": 0},
         "providers.tickets.retry_max_delay_seconds"),
        ({"kind": "http", "url": URL, "max_attempts": 2.5}, "providers.tickets.max_attempts"),
        ({"kind": "http", "url": URL, "fencing": "yes"}, "providers.tickets.fencing"),
        ({"kind": "http", "url": URL, "payload_schemas": []}, "providers.tickets.payload_schemas"),
        ({"kind": "http", "url": URL, "payload_schemas": [True]},
         "providers.tickets.payload_schemas"),
        ({"kind": "http", "url": URL, "dedup_retention_seconds": -1},
         "providers.tickets.dedup_retention_seconds"),
        ({"kind": "http", "url": URL, "lookup_consistency": "strong"},
         "providers.tickets.lookup_consistency"),
        ({"kind": "http", "url": URL, "lookup_url": URL + "/{operation_id}",
          "lookup_consistency": "maybe"},
         "providers.tickets.lookup_consistency"),
        ({"kind": "http", "url": URL, "lookup_url": URL},
         "providers.tickets.lookup_url"),
        ({"kind": "http", "url": URL, "lookup_url": URL + "/{operation_id}",
          "lookup_consistency": "eventual"}, "providers.tickets.lookup_settle_seconds"),
        ({"kind": "http", "url": URL, "in_flight_seconds": 1},
         "providers.tickets.in_flight_seconds"),
        ({"kind": "http", "url": URL, "mismatch_status": 409},
         "providers.tickets.mismatch_status"),
        ({"kind": "http", "url": URL, "headers": "env:X"}, "providers.tickets.headers"),
        ({"kind": "http", "url": URL, "headers": {"Idempotency-Key": "env:HOME"}},
         "providers.tickets.headers.Idempotency-Key"),
        ({"kind": "http", "url": URL, "headers": {"Bad Name": "env:HOME"}},
         "providers.tickets.headers"),
        ({"kind": "null", "lookup_consistency": "strong"},
         "providers.tickets.lookup_consistency"),
        ({"kind": "null", "delay_seconds": -1}, "providers.tickets.delay_seconds"),
        ({"kind": "nats", "stream": "S", "dedup_retention_seconds": 60},
         "providers.tickets.dedup_retention_seconds"),
        ({"kind": "nats"}, "providers.tickets.stream"),
        ({"kind": "nats", "stream": "S", "subject": "outbox.{tenant_id}"},
         "providers.tickets.subject"),
        ({"kind": "nats", "stream": "S", "subject": "outbox.*.{operation_id}"},
         "providers.tickets.subject"),
    ],
)
def test_errors_name_the_key(section: dict[str, Any], key: str) -> None:
    message = error_for(section)
    assert message.startswith(key + ":"), message


def test_bad_provider_name() -> None:
    assert "providers.bad name" in error_for({"kind": "null"}, name="bad name")


def test_a_failure_closes_providers_already_built() -> None:
    with pytest.raises(ProviderConfigError, match=r"providers\.b\.kind"):
        build_providers({"a": {"kind": "http", "url": URL}, "b": {"kind": "nope"}})
