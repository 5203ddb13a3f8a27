"""The Redis Streams provider against a real, throwaway ``redis-server`` per test: the entry
a consumer reads, the writer's deduplication window, the look-up, the declaration, the
server's refusals, an ambiguous append (a lost reply), and the configuration errors."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from outbox.errors import ProviderConfigError
from providers.base import LookupConsistency, LookupKind, OutcomeKind, TransportPhase
from providers.redis_stream import RedisStreamProvider
from providers.registry import build_providers
from tests.providers.scripted import make_dispatch
from tests.support.cutting_proxy import CuttingProxy
from tests.support.daemon import wait_until
from tests.support.pgcluster import free_port
from tests.support.redis_server import RedisServer

STREAM = "effects"


@pytest.fixture
def server(tmp_path: Path) -> Iterator[RedisServer]:
    with RedisServer(tmp_path / "redis") as running:
        yield running


def provider_at(url: str, **options: Any) -> RedisStreamProvider:
    built = build_providers({"bus": {"kind": "redis_stream", "url": url, "stream": STREAM,
                                     "timeout_seconds": 5, **options}})["bus"]
    assert isinstance(built, RedisStreamProvider)
    return built


def entries(server: RedisServer, stream: str = STREAM) -> list[dict[str, str]]:
    client = server.client()
    try:
        return [{k.decode(): v.decode() for k, v in fields.items()}
                for _, fields in client.xrange(stream)]
    finally:
        client.close()


def test_an_append_is_applied_and_the_entry_carries_the_operation(server: RedisServer) -> None:
    provider = provider_at(server.url)
    dispatch = make_dispatch(traceparent="00-" + "a" * 32 + "-" + "b" * 16 + "-01",
                             payload={"ticket": "T-1", "note": "é"})
    outcome = provider.send(dispatch)
    assert outcome.kind is OutcomeKind.APPLIED and not outcome.replayed
    assert outcome.receipt is not None and outcome.receipt["stream"] == STREAM
    [entry] = entries(server)
    assert json.loads(entry["payload"]) == {"ticket": "T-1", "note": "é"}
    assert entry["operation_id"] == dispatch.operation_id
    assert entry["tenant"] == dispatch.tenant_id
    assert entry["fencing_token"] == str(dispatch.fencing_token)
    assert entry["idempotency_key"] == dispatch.idempotency_key
    assert entry["traceparent"] == dispatch.traceparent
    provider.close()


def test_a_repeated_key_inside_the_window_appends_nothing(server: RedisServer) -> None:
    provider = provider_at(server.url)
    dispatch = make_dispatch()
    first = provider.send(dispatch)
    again = provider.send(make_dispatch(idempotency_key=dispatch.idempotency_key,
                                        fencing_token=2))
    assert again.kind is OutcomeKind.APPLIED and again.replayed
    assert first.receipt is not None and again.receipt is not None
    assert again.receipt["entry_id"] == first.receipt["entry_id"]
    assert len(entries(server)) == 1
    provider.close()


def test_the_window_is_the_keys_time_to_live_and_past_it_a_repeat_is_a_new_entry(
    server: RedisServer,
) -> None:
    """Why the dispatcher never re-sends blindly past the declared window."""
    provider = provider_at(server.url, key_ttl_seconds=0.3)
    assert provider.capabilities.dedup_retention_seconds == 0.3
    assert provider.capabilities.lookup_consistency is LookupConsistency.STRONG
    dispatch = make_dispatch()
    provider.send(dispatch)
    client = server.client()
    wait_until(lambda: not client.exists(provider.key_for(dispatch)), timeout=10,
               message="the key expired")
    client.close()
    assert not provider.send(dispatch).replayed
    assert len(entries(server)) == 2
    provider.close()


def test_the_look_up_finds_the_entry_and_trusts_a_missing_key_only_inside_the_window(
    server: RedisServer,
) -> None:
    provider = provider_at(server.url, key_ttl_seconds=3600)
    sent = make_dispatch()
    outcome = provider.send(sent)
    found = provider.lookup(sent)
    assert found.kind is LookupKind.FOUND
    assert found.receipt is not None and outcome.receipt is not None
    assert found.receipt["entry_id"] == outcome.receipt["entry_id"]
    now = datetime.now(UTC)
    fresh = make_dispatch(first_dispatched_at=now - timedelta(seconds=60))
    assert provider.lookup(fresh).kind is LookupKind.NOT_FOUND
    old = make_dispatch(first_dispatched_at=now - timedelta(seconds=3300))  # > 90%
    result = provider.lookup(old)
    assert result.kind is LookupKind.UNSUPPORTED  # it may have expired: a person decides
    assert "expired" in str(result.evidence)
    assert provider.lookup(make_dispatch()).kind is LookupKind.UNSUPPORTED  # no start known
    provider.close()


def test_a_server_that_cannot_be_reached_is_a_retry_before_the_write() -> None:
    provider = provider_at(f"redis://127.0.0.1:{free_port()}/0", timeout_seconds=2)
    outcome = provider.send(make_dispatch())
    assert outcome.kind is OutcomeKind.RETRYABLE
    assert outcome.transport_phase is TransportPhase.BEFORE_WRITE
    assert provider.lookup(make_dispatch()).kind is LookupKind.INDETERMINATE
    provider.close()


def test_a_key_of_another_type_is_rejected(server: RedisServer) -> None:
    client = server.client()
    client.set(STREAM, "not a stream")
    client.close()
    provider = provider_at(server.url)
    outcome = provider.send(make_dispatch())
    assert outcome.kind is OutcomeKind.REJECTED and outcome.error_class == "ResponseError"
    provider.close()


def test_a_read_only_replica_refuses_before_writing_a_clean_retry(tmp_path: Path) -> None:
    with RedisServer(tmp_path / "replica", "--replicaof", "127.0.0.1",
                     str(free_port())) as replica:
        provider = provider_at(replica.url)
        outcome = provider.send(make_dispatch())
        assert outcome.kind is OutcomeKind.RETRYABLE, outcome
        assert outcome.transport_phase is TransportPhase.RESPONSE
        assert entries(replica) == []
        provider.close()


def test_a_restarted_server_keeps_entries_and_keys_and_relearns_the_script(
    server: RedisServer,
) -> None:
    provider = provider_at(server.url)
    dispatch = make_dispatch()
    provider.send(dispatch)
    server.restart()  # SIGKILL: the script cache is gone, the append-only file is not
    assert provider.send(dispatch).replayed  # the key survived (appendfsync always)
    assert provider.send(make_dispatch()).kind is OutcomeKind.APPLIED
    assert len(entries(server)) == 2
    provider.close()


def test_a_lost_reply_is_ambiguous_and_the_look_up_or_a_repeat_settles_it(
    server: RedisServer,
) -> None:
    with CuttingProxy(server.port, message_end=None, reply=b"\r\n") as proxy:
        provider = provider_at(f"redis://127.0.0.1:{proxy.port}/0")
        provider.send(make_dispatch())  # the server has learnt the script
        dispatch = make_dispatch(first_dispatched_at=datetime.now(UTC))
        proxy.arm(dispatch.idempotency_key.encode())
        outcome = provider.send(dispatch)
        assert outcome.kind is OutcomeKind.AMBIGUOUS, outcome
        assert outcome.transport_phase is TransportPhase.AFTER_WRITE
        assert proxy.cut.is_set()
        keys = [e["idempotency_key"] for e in entries(server)]
        assert keys.count(dispatch.idempotency_key) == 1  # appended: only the reply was lost
        assert provider.lookup(dispatch).kind is LookupKind.FOUND
        assert provider.send(dispatch).replayed  # a repeat in the window: nothing appended
        assert len(entries(server)) == 2
        provider.close()


def test_max_length_trims_the_stream(server: RedisServer) -> None:
    provider = provider_at(server.url, max_length=10)
    for _ in range(400):
        provider.send(make_dispatch())
    assert len(entries(server)) < 400
    provider.close()


def test_a_server_that_may_evict_keys_is_refused_at_start(tmp_path: Path) -> None:
    with RedisServer(tmp_path / "lru", "--maxmemory", "64mb", "--maxmemory-policy",
                     "allkeys-lru") as lru, pytest.raises(ProviderConfigError) as error:
        provider_at(lru.url)
    assert str(error.value) == ("providers.bus.url: the server may evict deduplication keys "
                                "(maxmemory-policy allkeys-lru); set maxmemory-policy "
                                "noeviction")


@pytest.mark.parametrize(("section", "problem"), [
    ({"url": "redis://:secret@127.0.0.1:6379/0"}, "url: must not carry a password"),
    ({"url": "http://127.0.0.1"}, "url: must be a redis:// or rediss://"),
    ({"dedup_retention_seconds": 60}, "dedup_retention_seconds: is the key's time to live"),
    ({"stream": "effects.{operation}"}, "stream: may only use {tenant_id}"),
    ({"key_ttl_seconds": 0}, "key_ttl_seconds"),
    ({"password": "hunter2"}, "password: a literal credential"),
    ({"lookup_consistency": "eventual"}, "lookup_settle_seconds: is required"),
])
def test_configuration_errors_are_one_line_naming_the_key(section: dict[str, Any],
                                                          problem: str) -> None:
    config = {"kind": "redis_stream", "url": f"redis://127.0.0.1:{free_port()}/0",
              "stream": STREAM, **section}
    with pytest.raises(ProviderConfigError) as error:
        build_providers({"bus": config})
    assert f"providers.bus.{problem}" in str(error.value)
    assert "\n" not in str(error.value)



def test_a_connection_the_server_closed_while_idle_costs_a_reconnect_not_an_ambiguity(
    tmp_path: Path,
) -> None:
    with RedisServer(tmp_path / "idle", "--timeout", "1") as idle:  # closes idle clients
        provider = provider_at(idle.url)
        assert provider.send(make_dispatch()).kind is OutcomeKind.APPLIED
        watcher = idle.client()

        def ours_closed() -> bool:
            clients = watcher.client_list()
            return all(c.get("cmd") in ("client|list", "client") for c in clients)

        wait_until(ours_closed, timeout=30, message="the server closed the idle connection")
        watcher.close()
        outcome = provider.send(make_dispatch())
        assert outcome.kind is OutcomeKind.APPLIED, outcome
        assert len(entries(idle)) == 2
        provider.close()
