"""The null provider: instant, honest about what it cannot know."""

from __future__ import annotations

import threading

from providers.base import LookupConsistency, LookupKind, OutcomeKind
from providers.null import NullProvider
from providers.registry import build_providers
from tests.providers.scripted import make_dispatch


def build(**keys: object) -> NullProvider:
    provider = build_providers({"bench": {"kind": "null", **keys}})["bench"]
    assert isinstance(provider, NullProvider)
    return provider


def test_applies_instantly_and_reports_replays() -> None:
    provider = build()
    dispatch = make_dispatch()
    first, second = provider.send(dispatch), provider.send(dispatch)
    assert first.kind is OutcomeKind.APPLIED and first.receipt == {"null": True}
    assert first.replayed is False and second.replayed is True
    assert provider.applied_count == 1
    provider.close()


def test_lookup_found_for_own_keys_else_unsupported() -> None:
    provider = build()
    assert provider.capabilities.lookup_consistency is LookupConsistency.NONE
    assert provider.capabilities.dedup_retention_seconds == 86_400.0
    dispatch = make_dispatch()
    assert provider.lookup(dispatch).kind is LookupKind.UNSUPPORTED
    provider.send(dispatch)
    found = provider.lookup(dispatch)
    assert found.kind is LookupKind.FOUND and found.receipt == {"null": True}
    provider.close()


def test_thread_safe_under_concurrency() -> None:
    provider = build(dedup_retention_seconds=0, delay_seconds=0.001)
    dispatches = [make_dispatch() for _ in range(50)]

    def worker() -> None:
        for dispatch in dispatches:
            provider.send(dispatch)

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert provider.applied_count == 50
    assert provider.capabilities.dedup_retention_seconds == 0.0
    provider.close()
