"""The NATS JetStream provider against the machine's NATS (127.0.0.1:4222)."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Iterator

import pytest

from outbox.errors import ProviderConfigError
from providers.base import LookupConsistency, LookupKind, OutcomeKind
from providers.nats import NatsProvider, subject_matches, subject_token
from providers.registry import build_providers
from tests.providers.scripted import make_dispatch

pytestmark = pytest.mark.nats
SERVER = "nats://127.0.0.1:4222"


async def _admin(action: str, name: str, subjects: list[str], window: float) -> int:
    import nats
    from nats.js.api import StreamConfig

    nc = await nats.connect(SERVER, connect_timeout=2, max_reconnect_attempts=0)
    try:
        jsm = nc.jsm()
        if action == "add":
            await jsm.add_stream(StreamConfig(name=name, subjects=subjects,
                                              duplicate_window=window))
            return 0
        if action == "count":
            info = await jsm.stream_info(name)
            return int(info.state.messages)
        await jsm.delete_stream(name)
        return 0
    finally:
        await nc.close()


def admin(action: str, name: str, subjects: list[str] | None = None,
          window: float = 120.0) -> int:
    return asyncio.run(_admin(action, name, subjects or [], window))


@pytest.fixture
def stream() -> Iterator[tuple[str, str]]:
    """A uniquely named stream (2 min duplicate window) over ``t<id>.>``; deleted after."""
    tag = uuid.uuid4().hex[:10]
    name, prefix = f"OUTBOX_TEST_{tag}", f"t{tag}"
    try:
        admin("add", name, [f"{prefix}.>"])
    except Exception as exc:  # pragma: no cover - environment without NATS
        pytest.skip(f"NATS JetStream is not reachable on {SERVER}: {type(exc).__name__}")
    yield name, prefix
    admin("delete", name)


def build(name: str, prefix: str, **keys: object) -> NatsProvider:
    provider = build_providers({"bus": {
        "kind": "nats", "servers": SERVER, "stream": name,
        "subject": f"{prefix}.{{tenant_id}}.{{operation_id}}", "timeout_seconds": 2, **keys,
    }})["bus"]
    assert isinstance(provider, NatsProvider)
    return provider


def test_subject_tokens_are_injective_and_valid() -> None:
    values = ["a.b", "a_b", "a~2Eb", "", "*", ">", "a b", "é", "op-1"]
    tokens = [subject_token(v) for v in values]
    assert len(set(tokens)) == len(values)
    assert all(t and not set(t) & {".", "*", ">", " "} for t in tokens)
    assert subject_token("op-1_x") == "op-1_x"
    assert subject_matches("a.>", "a.b.c") and not subject_matches("a.>", "a")
    assert subject_matches("a.*.c", "a.b.c") and not subject_matches("a.*", "a.b.c")


def test_window_read_from_stream_and_duplicate_is_replayed(stream: tuple[str, str]) -> None:
    name, prefix = stream
    provider = build(name, prefix)
    try:
        assert provider.capabilities.dedup_retention_seconds == 120.0
        assert provider.capabilities.lookup_consistency is LookupConsistency.STRONG
        dispatch = make_dispatch(operation_id="op.1 with*odd>chars")
        assert provider.lookup(dispatch).kind is LookupKind.NOT_FOUND
        first, second = provider.send(dispatch), provider.send(dispatch)
        assert first.kind is OutcomeKind.APPLIED and first.replayed is False
        assert second.kind is OutcomeKind.APPLIED and second.replayed is True
        assert first.receipt is not None and second.receipt is not None
        assert first.receipt["seq"] == second.receipt["seq"]
        assert admin("count", name) == 1
        found = provider.lookup(dispatch)
        assert found.kind is LookupKind.FOUND
        assert found.receipt is not None and found.receipt["seq"] == first.receipt["seq"]
        other_key = make_dispatch(operation_id=dispatch.operation_id)
        assert provider.lookup(other_key).kind is LookupKind.NOT_FOUND
    finally:
        provider.close()


def test_resend_after_the_window_is_a_duplicate() -> None:
    """The hazard: past the duplicate window the same Nats-Msg-Id is stored again."""
    tag = uuid.uuid4().hex[:10]
    name, prefix = f"OUTBOX_TEST_{tag}", f"t{tag}"
    try:
        admin("add", name, [f"{prefix}.>"], window=1.0)
    except Exception as exc:  # pragma: no cover
        pytest.skip(f"NATS JetStream is not reachable: {type(exc).__name__}")
    try:
        provider = build(name, prefix)
        try:
            assert provider.capabilities.dedup_retention_seconds == 1.0
            dispatch = make_dispatch()
            assert provider.send(dispatch).replayed is False
            assert provider.send(dispatch).replayed is True
            time.sleep(1.3)
            late = provider.send(dispatch)
            assert late.kind is OutcomeKind.APPLIED and late.replayed is False
            assert admin("count", name) == 2
        finally:
            provider.close()
    finally:
        admin("delete", name)


def test_subject_outside_the_stream_is_a_config_error(stream: tuple[str, str]) -> None:
    name, _prefix = stream
    with pytest.raises(ProviderConfigError, match=r"providers\.bus\.subject"):
        build(name, "elsewhere")


def test_missing_stream_is_a_config_error(stream: tuple[str, str]) -> None:
    _name, prefix = stream
    with pytest.raises(ProviderConfigError, match=r"providers\.bus\.stream"):
        build("NO_SUCH_STREAM_" + uuid.uuid4().hex[:6], prefix)


def test_unreachable_server_fails_at_start(stream: tuple[str, str]) -> None:
    from providers.nats import ProviderUnavailableError

    name, prefix = stream
    with pytest.raises(ProviderUnavailableError):
        build(name, prefix, servers="nats://127.0.0.1:1", connect_timeout_seconds=0.5)
